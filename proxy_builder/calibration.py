"""Calibration data for the routing statistics: sources and batching (no torch).

A *calibration source* is any callable ``(arg: str) -> Iterable[str | Sequence[int]]``
yielding documents as text (tokenized with the model's tokenizer) or as token
ids.  Sources are looked up by name in :data:`CALIBRATION_SOURCES`; a spec string
is ``name:arg`` or a bare path.  Built in:

- ``text:PATH`` — a UTF-8 text file, one document per non-empty line.
- ``jsonl:PATH[#field]`` — one JSON object per line; the document is ``field``
  (default: the first of ``text``, ``content``, ``prompt`` present), or the
  object's ``input_ids`` list if it has one.
- ``tokenized:DIR`` — a tokenized dataset: ``DIR/input_ids.npy``, a 2-D integer
  array [documents, length], with an optional ``DIR/attention_mask.npy`` of the
  same shape (0 = padding, dropped); or a 1-D array, cut into ``seq_len`` pieces.
- ``random:SEED`` — uniformly random token ids (smoke tests; no meaning).

A bare path picks ``tokenized`` for a directory, ``jsonl`` for ``*.jsonl`` and
``text`` otherwise.  Higher stages register more sources with
:func:`register_calibration_source` (the CLI registers ``synthetic``, the
reproduction task corpus, without this package importing that stage).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from moeproxy.proxy_builder.errors import CalibrationError
from moeproxy.proxy_builder.layer_stats import Batch

Document = str | Sequence[int]
CalibrationSource = Callable[[str], Iterable[Document]]


def _text_source(arg: str) -> Iterator[str]:
    path = _existing(arg)
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield line.rstrip("\n")


def _jsonl_source(arg: str) -> Iterator[Document]:
    path_s, _, field = arg.partition("#")
    path = _existing(path_s)
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CalibrationError(f"{path}:{n}: not JSON ({exc.msg})") from None
            if isinstance(obj, str):
                yield obj
                continue
            if field:
                if field not in obj:
                    raise CalibrationError(f"{path}:{n}: no field {field!r}")
                yield obj[field]
                continue
            if "input_ids" in obj:
                yield [int(i) for i in obj["input_ids"]]
                continue
            for key in ("text", "content", "prompt"):
                if key in obj:
                    yield str(obj[key])
                    break
            else:
                raise CalibrationError(f"{path}:{n}: no text/content/prompt/input_ids field (use {path_s}#FIELD)")


def _tokenized_source(arg: str) -> Iterator[list[int]]:
    directory = _existing(arg)
    ids_path = directory / "input_ids.npy"
    if not ids_path.is_file():
        raise CalibrationError(f"tokenized calibration dir {directory} has no input_ids.npy")
    ids = np.load(ids_path, mmap_mode="r")
    if not np.issubdtype(ids.dtype, np.integer):
        raise CalibrationError(f"{ids_path} holds {ids.dtype}, expected integer token ids")
    if ids.ndim == 1:
        yield ids.tolist()  # cut into seq_len pieces by make_batches
        return
    mask_path = directory / "attention_mask.npy"
    mask = np.load(mask_path, mmap_mode="r") if mask_path.is_file() else None
    if mask is not None and mask.shape != ids.shape:
        raise CalibrationError(f"{mask_path} has shape {mask.shape}, input_ids {ids.shape}")
    for row in range(ids.shape[0]):
        r = np.asarray(ids[row])
        yield (r[np.asarray(mask[row]).astype(bool)] if mask is not None else r).tolist()


def _random_source(arg: str) -> Iterator[list[int]]:
    # Token ids drawn later against the vocabulary size; see make_batches.
    seed = int(arg or 0)
    rng = np.random.default_rng(seed)
    while True:
        yield _RandomDocument(rng)


class _RandomDocument(list):
    """Marker: make_batches fills it with random ids of the right length and vocabulary."""

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.rng = rng


CALIBRATION_SOURCES: dict[str, CalibrationSource] = {
    "text": _text_source,
    "jsonl": _jsonl_source,
    "tokenized": _tokenized_source,
    "random": _random_source,
}


def register_calibration_source(name: str, source: CalibrationSource) -> None:
    """Add (or replace) a named source, e.g. ``register_calibration_source("synthetic", fn)``."""
    if not name.isidentifier():
        raise ValueError(f"calibration source name must be an identifier, got {name!r}")
    CALIBRATION_SOURCES[name] = source


def parse_spec(spec: str) -> tuple[str, str]:
    """``"name:arg"`` → (name, arg); a bare path → (text|jsonl|tokenized, path)."""
    name, sep, arg = spec.partition(":")
    if sep and name in CALIBRATION_SOURCES:
        return name, arg
    if sep and name.isidentifier() and len(name) > 1:
        raise CalibrationError(
            f"unknown calibration source {name!r}; known: {', '.join(sorted(CALIBRATION_SOURCES))} "
            "(or give a path to a .txt/.jsonl file or a tokenized directory)"
        )
    path = Path(spec)
    if path.is_dir():
        return "tokenized", spec
    if path.suffix == ".jsonl":
        return "jsonl", spec
    return "text", spec


def validate_spec(spec: str) -> None:
    """Cheap check before any expensive work: the source exists and its file/dir is there."""
    name, arg = parse_spec(spec)
    if name in ("text", "jsonl"):
        _existing(arg.partition("#")[0])
    elif name == "tokenized" and not (_existing(arg) / "input_ids.npy").is_file():
        raise CalibrationError(f"tokenized calibration dir {arg} has no input_ids.npy")


def _existing(arg: str) -> Path:
    path = Path(arg).expanduser()
    if not path.exists():
        raise CalibrationError(f"calibration data {path} does not exist")
    return path


def documents(spec: str | Iterable[Document]) -> Iterable[Document]:
    if isinstance(spec, str):
        name, arg = parse_spec(spec)
        return CALIBRATION_SOURCES[name](arg)
    return spec


def make_batches(
    docs: Iterable[Document],
    *,
    tokenize: Callable[[str], list[int]] | None,
    vocab_size: int,
    max_tokens: int,
    seq_len: int,
    batch_size: int,
    pad_id: int = 0,
) -> list[Batch]:
    """Tokenize and pack documents into right-padded batches holding at most ``max_tokens`` real tokens.

    Each document becomes one or more sequences of at most ``seq_len`` tokens;
    the last sequence is cut so the total is exactly ``max_tokens`` when the
    source has enough.
    """
    if max_tokens <= 0 or seq_len <= 0 or batch_size <= 0:
        raise CalibrationError("max_tokens, seq_len and batch_size must be positive")
    seqs: list[list[int]] = []
    total = 0
    for doc in docs:
        if isinstance(doc, _RandomDocument):
            ids = doc.rng.integers(0, vocab_size, size=seq_len).tolist()
        elif isinstance(doc, str):
            if tokenize is None:
                raise CalibrationError("the calibration source yields text but the model directory has no tokenizer")
            ids = tokenize(doc)
        else:
            ids = [int(i) for i in doc]
        for start in range(0, len(ids), seq_len):
            piece = ids[start : start + seq_len][: max_tokens - total]
            if not piece:
                break
            bad = [i for i in piece if not 0 <= i < vocab_size]
            if bad:
                raise CalibrationError(f"token id {bad[0]} outside the vocabulary (size {vocab_size})")
            seqs.append(piece)
            total += len(piece)
        if total >= max_tokens:
            break
    if total == 0:
        raise CalibrationError("the calibration source yielded no tokens")
    batches = []
    for i in range(0, len(seqs), batch_size):
        group = seqs[i : i + batch_size]
        width = max(len(s) for s in group)
        ids = np.full((len(group), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(group), width), dtype=np.int64)
        for row, s in enumerate(group):
            ids[row, : len(s)] = s
            mask[row, : len(s)] = 1
        batches.append(Batch(ids, mask))
    return batches


def split_heldout(batches: list[Batch], fraction: float) -> tuple[list[Batch], list[Batch]]:
    """(statistics batches, held-out batches): the last ``fraction`` of batches, at least one each."""
    if len(batches) < 2:
        raise CalibrationError(
            "choosing view weights automatically needs at least 2 calibration batches "
            "(raise --max-tokens or lower --batch-size)"
        )
    n_held = min(len(batches) - 1, max(1, round(len(batches) * fraction)))
    return batches[:-n_held], batches[-n_held:]
