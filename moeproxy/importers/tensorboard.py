"""TensorBoard event files, read by tensorboard's own ``EventAccumulator`` (never by hand).

A source is an event file or a directory holding the event files of one run (found at any depth:
TRL writes them under ``runs/<date>_<host>/``). Event files in more than one directory are more
than one run, and the user picks one. Scalars written as ``simple_value`` (``torch``'s
``SummaryWriter``, tensorboardX) and as scalar tensors (``tf.summary`` in TF 2) are both read.
"""

from __future__ import annotations

from pathlib import Path

from moeproxy.importers.base import InvalidSource, Records

EVENT_FILE_GLOB = "events.out.tfevents.*"


def _event_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob(EVENT_FILE_GLOB) if p.is_file())
    return [path] if path.name.startswith("events.out.tfevents.") else []


def detect(path: Path, head: str | None) -> bool:
    return bool(_event_files(path))


def _run_directory(path: Path) -> Path:
    files = _event_files(path)
    if not files:
        raise InvalidSource(f"{path}: no TensorBoard event files ({EVENT_FILE_GLOB})")
    if not path.is_dir():
        return path
    folders = sorted({f.parent for f in files})
    if len(folders) > 1:
        listed = ", ".join(str(f) for f in folders[:5])
        raise InvalidSource(f"{path}: event files of {len(folders)} runs ({listed}); give one of these folders")
    return folders[0]


def read(path: Path) -> Records:
    try:
        from tensorboard.backend.event_processing import event_accumulator
        from tensorboard.util import tensor_util
    except ImportError:
        raise InvalidSource(f"{path}: reading TensorBoard files needs the tensorboard package "
                            "(pip install tensorboard)") from None
    # Size guidance 0 keeps every event: the default samples 10,000 points a tag.
    accumulator = event_accumulator.EventAccumulator(
        str(_run_directory(path)), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    try:
        accumulator.Reload()
    except Exception as exc:  # the loader's DataLossError and friends
        raise InvalidSource(f"{path}: unreadable event file ({exc})") from None
    tags = accumulator.Tags()
    steps: dict[int, dict[str, float]] = {}
    for tag in tags.get("scalars", []):
        for event in accumulator.Scalars(tag):
            steps.setdefault(int(event.step), {})[tag] = float(event.value)
    for tag in tags.get("tensors", []):
        for event in accumulator.Tensors(tag):
            array = tensor_util.make_ndarray(event.tensor_proto)
            if array.ndim == 0 and array.dtype.kind in "fiu":
                steps.setdefault(int(event.step), {})[tag] = float(array)
    yield from sorted(steps.items())
