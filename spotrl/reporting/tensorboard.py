"""Every numeric metric of a run as TensorBoard scalars under RUN/tensorboard/, exactly once per (tag, step).

`sync_tensorboard(run_dir)` is called by the train flow after every iteration, and again after a
resume. It appends, as one event per record (step = iteration), the records of RUN/metrics.jsonl
(tags "train/<key>", nested dicts flattened with "/": "train/timing/rollout_seconds") and
RUN/eval.jsonl ("eval/<key>") whose iteration is past what RUN/tensorboard already holds for each
of their tags. Non-numeric values (strings, lists, bools, None) and the iteration itself are left out.

Exactly once: what RUN/tensorboard holds is read from the event files themselves, once per process
and run directory (there is no separate state file, so no kill can leave one out of step with the
events). The reader stops at a torn or corrupt record, so a tail cut by a kill counts as not written
and is written again, into this process's own new event file, named to sort after every existing
one (TensorBoard reads a directory's event files in name order). After that the watermarks live in
memory, next to a writer cached per run directory, so one call costs reading the two .jsonl files
plus writing the new events (and one fsync). `reset()` forgets them, as a new process would.

Local run directories are written in place. For a gs:// run directory the events are written to a
local temporary directory and this process's event file is uploaded whole (one PUT) after each sync.
One writer per run directory: the train flow holds RUN/.lock while it syncs.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import socket
import struct
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tensorboardX.proto import event_pb2, summary_pb2
from tensorboardX.record_writer import RecordWriter, masked_crc32c

from spotrl.reporting import flatten, step_of
from spotrl.storage.paths import AnyPath, RemotePath, as_path
from spotrl.storage.records import read_records

log = logging.getLogger(__name__)

TB_DIR = "tensorboard"
STREAMS = (("metrics", "train"), ("eval", "eval"))  # (RUN/<kind>.jsonl, tag group)
_HEADER = struct.Struct("<QI")  # record length, masked crc32c of the length
_FOOTER = struct.Struct("<I")  # masked crc32c of the data
_STAMP = re.compile(r"events\.out\.tfevents\.(\d{10})\.")


# --- pure parts ------------------------------------------------------------------------------------
def record_scalars(record: dict, group: str) -> dict[str, float]:
    """The TensorBoard scalars of one record: {"<group>/<flattened key>": value}, the iteration left out."""
    return {f"{group}/{key}": value for key, value in flatten(record).items() if key != "iteration"}


def pending_events(records: list[dict], group: str, watermarks: dict[str, int]) -> list[tuple[int, dict[str, float]]]:
    """(step, scalars) for what is not written yet: the tags of each record whose step is past the tag's watermark.

    Records are taken in step order; a record without an iteration is skipped. `watermarks` is not changed.
    """
    # records at or below every written tag's watermark were written whole (one event per record, in step
    # order): skip them without flattening (a cost per call that would grow with the run)
    floor = min((mark for tag, mark in watermarks.items() if tag.startswith(f"{group}/")), default=None)
    out = []
    for record in sorted((r for r in records if step_of(r) is not None), key=step_of):
        step = step_of(record)
        if floor is not None and step <= floor:
            continue
        scalars = {
            tag: value for tag, value in record_scalars(record, group).items() if step > watermarks.get(tag, -(2**63))
        }
        if scalars:
            out.append((step, scalars))
    return out


def parse_events(data: bytes) -> tuple[list[event_pb2.Event], int]:
    """The events of an event file's bytes, and the length of its intact prefix.

    Reading stops at the first torn (short) or corrupt (bad checksum, unparsable) record: what a kill
    in the middle of a write leaves behind.
    """
    events, offset = [], 0
    while offset + _HEADER.size <= len(data):
        length, length_crc = _HEADER.unpack_from(data, offset)
        if masked_crc32c(data[offset : offset + 8]) != length_crc:
            break
        start, end = offset + _HEADER.size, offset + _HEADER.size + length
        if end + _FOOTER.size > len(data):
            break
        payload = data[start:end]
        if masked_crc32c(payload) != _FOOTER.unpack_from(data, end)[0]:
            break
        event = event_pb2.Event()
        try:
            event.ParseFromString(payload)
        except Exception:
            break
        events.append(event)
        offset = end + _FOOTER.size
    return events, offset


def watermarks_of(events: list[event_pb2.Event], into: dict[str, int] | None = None) -> dict[str, int]:
    """The highest step written per scalar tag."""
    marks = {} if into is None else into
    for event in events:
        if not event.HasField("summary"):
            continue
        for value in event.summary.value:
            if event.step > marks.get(value.tag, -(2**63)):
                marks[value.tag] = event.step
    return marks


def scalar_event(step: int, scalars: dict[str, float], wall_time: float) -> event_pb2.Event:
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in scalars.items()])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def next_event_file_name(existing: list[str], now: float, host: str, unique: str) -> str:
    """A new event file name that sorts after every existing one.

    TensorBoard reads a directory's event files in name order (and, live, never goes back to an
    earlier name), so this process's file must come last even when the last one was made in the
    same second: the 10-digit timestamp is moved past the newest existing one.
    """
    stamps = [int(m.group(1)) for m in (_STAMP.match(name) for name in existing) if m]
    stamp = max([int(now), *(s + 1 for s in stamps)])
    return f"events.out.tfevents.{stamp:010d}.{host}.{unique}"


# --- the per-process writer ------------------------------------------------------------------------
class _EventFile:
    """One event file, written synchronously: each flush is a flush + fsync of everything written."""

    def __init__(self, path: Path):
        self.path = path
        self._records = RecordWriter(str(path))
        self.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def write(self, event: event_pb2.Event) -> None:
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.flush()
        self._records.close()


@dataclass
class _Sink:
    """This process's event file for one run directory, and what the directory holds per tag."""

    local_dir: Path
    remote_dir: RemotePath | None
    watermarks: dict[str, int]
    existing: list[str]  # the event file names in RUN/tensorboard when this process first looked
    writer: _EventFile | None = None
    unsent: bool = False  # the local event file holds events the remote copy lacks
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, events: list[event_pb2.Event]) -> None:
        """Append the events to this process's file (flushed and fsynced) and count them as written."""
        if self.writer is None:
            self.local_dir.mkdir(parents=True, exist_ok=True)
            # last in name order, and a name of its own (pid + random): never shared with (and truncating) another
            unique = f"{os.getpid()}.{uuid.uuid4().hex[:8]}"
            name = next_event_file_name(self.existing, time.time(), socket.gethostname(), unique)
            self.writer = _EventFile(self.local_dir / name)
        for event in events:
            self.writer.write(event)
        self.writer.flush()  # flush + fsync
        watermarks_of(events, self.watermarks)
        self.unsent = self.remote_dir is not None

    def upload(self) -> None:
        """gs://: put this process's whole event file under RUN/tensorboard (one PUT; retried by the next sync)."""
        if self.unsent and self.writer is not None:
            (self.remote_dir / self.writer.path.name).write_bytes(self.writer.path.read_bytes())
            self.unsent = False

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


_SINKS: dict[str, _Sink] = {}
_SINKS_LOCK = threading.Lock()


def _open_sink(run_dir: AnyPath) -> _Sink:
    """Read what RUN/tensorboard holds (once per process) and prepare a writer for it."""
    tb_dir = run_dir / TB_DIR
    marks: dict[str, int] = {}
    files = list(tb_dir.glob("events.out.tfevents.*")) if tb_dir.exists() else []
    for path in files:
        watermarks_of(parse_events(path.read_bytes())[0], marks)
    if isinstance(run_dir, RemotePath):
        local = Path(tempfile.mkdtemp(prefix="spotrl-tensorboard-"))
        log.info("tensorboard: events for %s are written in %s and uploaded after each sync", tb_dir, local)
        return _Sink(local_dir=local, remote_dir=tb_dir, watermarks=marks, existing=[p.name for p in files])
    return _Sink(local_dir=Path(tb_dir), remote_dir=None, watermarks=marks, existing=[p.name for p in files])


def _sink(run_dir: AnyPath) -> _Sink:
    key = str(run_dir)
    with _SINKS_LOCK:
        sink = _SINKS.get(key)
        if sink is None:
            sink = _SINKS[key] = _open_sink(run_dir)
        return sink


def sync_tensorboard(run_dir: str | AnyPath) -> int:
    """Append the records not yet in RUN/tensorboard as scalars; the number of (tag, step) points written."""
    run_dir = as_path(run_dir).resolve()
    sink = _sink(run_dir)
    with sink.lock:
        now = time.time()
        events, points = [], 0
        for kind, group in STREAMS:
            for step, scalars in pending_events(read_records(run_dir, kind), group, sink.watermarks):
                events.append(scalar_event(step, scalars, now))
                points += len(scalars)
        if events:
            sink.write(events)
        sink.upload()
    return points


def reset(run_dir: str | AnyPath | None = None) -> None:
    """Close the cached writer of a run directory (all when None): the next sync reads the event files again,
    as a new process would."""
    with _SINKS_LOCK:
        keys = list(_SINKS) if run_dir is None else [str(as_path(run_dir).resolve())]
        for key in keys:
            sink = _SINKS.pop(key, None)
            if sink is not None:
                sink.close()


atexit.register(reset)
