"""Prefect flows, the run config and the `spotrl` command line."""
