"""A free TCP port on this machine: for the private Prefect server, a coordinator, a test's server."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the OS picks it; closed again before it is returned)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
