"""Reading and writing safetensors checkpoints at the byte level (no torch).

A safetensors file is an 8-byte little-endian header length, a JSON header
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``)
and the tensor bytes.  The surgery only ever copies whole tensors or contiguous
dim-0 slices of them, so it works on byte ranges: tensors are streamed from the
source file to the output in bounded chunks and are never decoded, which keeps
copies byte-identical for every dtype (bf16, fp8 and their scales included) and
peak memory independent of the shard size.
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from moeproxy.proxy_builder.errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_CHUNK = 16 * 1024 * 1024
_ALIGN = 8  # header padded so tensor data starts 8-byte aligned (what safetensors writes)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Shard:
    path: Path
    tensors: tuple[TensorInfo, ...]  # in file order
    metadata: dict[str, str] | None


def read_header(path: Path) -> Shard:
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{path} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(fh.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path} has an unreadable safetensors header: {exc}") from None
    base = 8 + length
    metadata = header.pop("__metadata__", None)
    tensors = [
        TensorInfo(name, v["dtype"], tuple(v["shape"]), base + v["data_offsets"][0], base + v["data_offsets"][1])
        for name, v in header.items()
    ]
    tensors.sort(key=lambda t: t.begin)
    return Shard(Path(path), tuple(tensors), metadata)


@dataclass(frozen=True)
class Checkpoint:
    """The safetensors shards of a model directory, with the index if there is one."""

    directory: Path
    shards: tuple[Shard, ...]
    index: dict[str, Any] | None

    def tensors(self) -> Iterator[tuple[Shard, TensorInfo]]:
        for shard in self.shards:
            for t in shard.tensors:
                yield shard, t

    def tensor_map(self) -> dict[str, tuple[Shard, TensorInfo]]:
        return {t.name: (s, t) for s, t in self.tensors()}

    @property
    def largest_shard_bytes(self) -> int:
        return max(s.path.stat().st_size for s in self.shards)


def open_checkpoint(directory: Path | str) -> Checkpoint:
    """Headers of every shard; raises ``CheckpointError`` for missing or inconsistent files."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"model directory {directory} does not exist")
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory} has no config.json")
    index_path = directory / INDEX_NAME
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        files = sorted(set(index.get("weight_map", {}).values()))
        missing = [f for f in files if not (directory / f).is_file()]
        if missing:
            raise CheckpointError(f"{directory}: shards named in {INDEX_NAME} are missing: {', '.join(missing)}")
        shards = tuple(read_header(directory / f) for f in files)
        on_disk = {t.name: s.path.name for s in shards for t in s.tensors}
        if on_disk != index["weight_map"]:
            raise CheckpointError(f"{directory}: {INDEX_NAME} does not match the tensors in its shards")
        return Checkpoint(directory, shards, index)
    if (directory / SINGLE_NAME).is_file():
        return Checkpoint(directory, (read_header(directory / SINGLE_NAME),), None)
    if any(directory.glob("*.bin")) or any(directory.glob("*.pt")):
        raise CheckpointError(
            f"{directory} holds PyTorch .bin weights only; the builder reads safetensors "
            "(convert with model.save_pretrained(dir) first)"
        )
    raise CheckpointError(f"{directory} has no {SINGLE_NAME} and no {INDEX_NAME}")


@dataclass(frozen=True)
class Piece:
    """Bytes [begin, end) of a source file that go into an output tensor, in order."""

    path: Path
    begin: int
    end: int


@dataclass(frozen=True)
class OutputTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]

    @property
    def nbytes(self) -> int:
        return sum(p.end - p.begin for p in self.pieces)


def whole(shard: Shard, t: TensorInfo, name: str | None = None) -> OutputTensor:
    return OutputTensor(name or t.name, t.dtype, t.shape, (Piece(shard.path, t.begin, t.end),))


def dim0_rows(shard: Shard, t: TensorInfo, rows: Iterable[int], name: str | None = None) -> OutputTensor:
    """The given dim-0 rows of a tensor, in the given order (router rows, fused experts, biases)."""
    rows = list(rows)
    if not t.shape:
        raise CheckpointError(f"{t.name} is a scalar; cannot slice rows")
    n = t.shape[0]
    stride = t.nbytes // n
    if stride * n != t.nbytes:
        raise CheckpointError(f"{t.name}: {t.nbytes} bytes do not split into {n} rows")
    if any(not 0 <= r < n for r in rows):
        raise CheckpointError(f"{t.name}: rows {rows} out of range for dim 0 of size {n}")
    pieces = tuple(Piece(shard.path, t.begin + r * stride, t.begin + (r + 1) * stride) for r in rows)
    return OutputTensor(name or t.name, t.dtype, (len(rows), *t.shape[1:]), pieces)


def write_safetensors(path: Path, tensors: list[OutputTensor], metadata: dict[str, str] | None) -> int:
    """Write ``tensors`` in order, streaming bytes from their sources; returns the data size."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % _ALIGN)
    handles: dict[Path, BinaryIO] = {}
    with contextlib.ExitStack() as stack, open(path, "wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for t in tensors:
            for p in t.pieces:
                src = handles.get(p.path)
                if src is None:
                    src = handles[p.path] = stack.enter_context(open(p.path, "rb"))
                _copy_range(src, out, p.begin, p.end)
    return offset


def _copy_range(src: BinaryIO, dst: BinaryIO, begin: int, end: int) -> None:
    # os.sendfile / copy_file_range would avoid user-space buffers, but the
    # chunked read keeps behaviour identical on every platform; 16 MiB chunks
    # bound the memory a copy can use.
    src.seek(begin)
    remaining = end - begin
    while remaining:
        chunk = src.read(min(_CHUNK, remaining))
        if not chunk:
            raise CheckpointError(f"{src.name} ended early (truncated shard?)")
        dst.write(chunk)
        remaining -= len(chunk)

