"""TensorBoard event files: TFRecord framing read here, every record checked and parsed with
tensorboard's own ``Event`` proto.

A source is an event file or a directory holding the event files of one run (found at any depth:
TRL writes them under ``runs/<date>_<host>/``). Event files in more than one directory are more
than one run, and the user picks one. Scalars written as ``simple_value`` (``torch``'s
``SummaryWriter``, tensorboardX) and as scalar tensors (``tf.summary`` in TF 2, tensorboard's own
``Writer``) are both read.

Why not tensorboard's ``EventAccumulator``: without TensorFlow installed it reads the framing
through tensorboard's pure-Python stub, which computes each record's two CRC32C checksums byte by
byte in Python, then keeps every event in per-tag reservoirs; a 1,000,000-point run took 29 s to
read (docs/benchmarks.md, import_tensorboard). The framing (TensorFlow's ``record_writer.cc``) is
a little-endian uint64 length, the masked CRC32C of those 8 bytes, the payload, the masked CRC32C
of the payload. Here each file is memory-mapped, checksums go through ``google-crc32c`` (C, with
the CPU's CRC instruction; tensorboard's own Python CRC when it is not installed) and payloads
through the proto's C parser (upb). What ``EventAccumulator`` does with what it reads is kept:

- a record cut short at the end of a file is a file still being written: reading stops there;
  a checksum that does not match is a damaged file, refused with its offset;
- the files of a run are read in name order (their names start with the writer's timestamp);
- a later point of a tag at a step replaces the earlier one;
- a restart purges the orphaned points, as TensorBoard does: a ``SessionLog.START`` at step T in a
  file of version 2 or later (every current writer) drops every point at step >= T read before
  it; in an older file, an event whose step goes back drops that event's tags at steps >= its step.
  Unlike ``EventAccumulator``, which purges only its simple-value reservoirs, scalar tensors are
  purged too: the restart orphans them the same way.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from moeproxy.importers.base import InvalidSource, Records

EVENT_FILE_GLOB = "events.out.tfevents.*"
_HEADER = struct.Struct("<QI")  # payload length, masked CRC32C of the length's 8 bytes
_FOOTER = struct.Struct("<I")  # masked CRC32C of the payload
_MASK_DELTA = 0xA282EAD8  # TensorFlow's crc32c::Mask
_SESSION_START = 1  # tensorboard.compat.proto.event_pb2.SessionLog.START


def _event_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob(EVENT_FILE_GLOB) if p.is_file())
    return [path] if path.name.startswith("events.out.tfevents.") else []


def detect(path: Path, head: str | None) -> bool:
    return bool(_event_files(path))


def _run_files(path: Path) -> list[Path]:
    files = _event_files(path)
    if not files:
        raise InvalidSource(f"{path}: no TensorBoard event files ({EVENT_FILE_GLOB})")
    folders = sorted({f.parent for f in files})
    if len(folders) > 1:
        listed = ", ".join(str(f) for f in folders[:5])
        raise InvalidSource(f"{path}: event files of {len(folders)} runs ({listed}); give one of these folders")
    return sorted(files, key=lambda f: f.name)


def _crc32c() -> Callable[[bytes], int]:
    try:
        import google_crc32c
    except ImportError:  # correct, only slower: tensorboard's pure-Python table
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as slow

        return lambda data: slow(bytes(data))
    return google_crc32c.value


def masked_crc32c(crc: int) -> int:
    """TensorFlow's ``crc32c::Mask``: rotate right by 15 bits, add a constant (mod 2**32)."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def records(path: Path, crc32c: Callable[[bytes], int] | None = None) -> Iterator[bytes]:
    """The payloads of one TFRecord file, checked; stops at a record cut short at the end."""
    crc32c = crc32c or _crc32c()
    with path.open("rb") as fh:
        size = path.stat().st_size
        if size == 0:
            return
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            pos = 0
            while pos + _HEADER.size <= size:
                length, length_crc = _HEADER.unpack_from(data, pos)
                if masked_crc32c(crc32c(data[pos:pos + 8])) != length_crc:
                    raise InvalidSource(f"{path}: damaged event file (bad length checksum at byte {pos})")
                start = pos + _HEADER.size
                end = start + length
                if end + _FOOTER.size > size:
                    return  # being written: the rest of the record is not on disk yet
                payload = data[start:end]
                if masked_crc32c(crc32c(payload)) != _FOOTER.unpack_from(data, end)[0]:
                    raise InvalidSource(f"{path}: damaged event file (bad record checksum at byte {pos})")
                yield payload
                pos = end + _FOOTER.size


class _Points:
    """The points of one run as read so far, with TensorBoard's purge of orphaned points."""

    def __init__(self) -> None:
        self.by_tag: dict[str, dict[int, float]] = {}
        self.file_version: float | None = None
        self.most_recent_step = -1

    def purge(self, step: int, tags: Iterator[str] | None = None) -> None:
        for tag in (self.by_tag if tags is None else tags):
            series = self.by_tag.get(tag)
            if series:
                for s in [s for s in series if s >= step]:
                    del series[s]

    def add(self, event) -> None:
        # One WhichOneof instead of a HasField per kind: file_version, summary and session_log
        # are members of the Event's one-of "what", and this runs once per record.
        kind = event.WhichOneof("what")
        if kind == "file_version":
            version = event.file_version.split("brain.Event:")[-1]
            try:
                self.file_version = float(version)
            except ValueError:
                self.file_version = None  # TensorBoard then uses the out-of-order rule too
        has_summary = kind == "summary"
        step = int(event.step)
        if self.file_version is not None and self.file_version >= 2:
            if kind == "session_log" and event.session_log.status == _SESSION_START:
                self.purge(step)
        elif step < self.most_recent_step and has_summary:
            self.purge(step, (v.tag for v in event.summary.value))
        else:
            self.most_recent_step = step
        if not has_summary:
            return
        by_tag = self.by_tag
        for value in event.summary.value:
            number = _scalar(value)
            if number is not None:
                series = by_tag.get(value.tag)
                if series is None:
                    series = by_tag[value.tag] = {}
                series[step] = number


def _scalar(value) -> float | None:
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor":
        tensor = value.tensor
        if tensor.tensor_shape.dim:  # a histogram, an image, a text: not a scalar
            return None
        from tensorboard.util import tensor_util

        array = tensor_util.make_ndarray(tensor)
        if array.ndim == 0 and array.dtype.kind in "fiu":
            return float(array)
    return None


def read(path: Path) -> Records:
    try:
        from tensorboard.compat.proto import event_pb2
    except ImportError:
        raise InvalidSource(f"{path}: reading TensorBoard files needs the tensorboard package "
                            "(pip install 'moeproxy[tensorboard]')") from None
    from google.protobuf.message import DecodeError

    parse = event_pb2.Event.FromString
    crc32c = _crc32c()
    points = _Points()
    for file in _run_files(path):
        for payload in records(file, crc32c):
            try:
                event = parse(payload)
            except DecodeError as exc:
                raise InvalidSource(f"{file}: a record is not an Event ({exc})") from None
            points.add(event)
    steps: dict[int, dict[str, float]] = {}
    for tag, series in points.by_tag.items():
        for step, number in series.items():
            steps.setdefault(step, {})[tag] = number
    yield from sorted(steps.items())
