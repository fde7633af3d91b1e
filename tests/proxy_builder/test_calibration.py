"""Calibration sources and batching (torch-free)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from moeproxy.proxy_builder import calibration as calib
from moeproxy.proxy_builder.errors import CalibrationError


def _tok(text: str) -> list[int]:
    return [4 + (b % 200) for b in text.encode()]


def _batches(spec, **kw):
    args = {"tokenize": _tok, "vocab_size": 260, "max_tokens": 1000, "seq_len": 16, "batch_size": 4}
    args.update(kw)
    return calib.make_batches(calib.documents(spec), **args)


def test_text_file_one_document_per_line(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("abc\n\n  \ndefgh\n")
    batches = _batches(str(path))
    assert [b.real_tokens for b in batches] == [8]
    assert batches[0].input_ids[0, :3].tolist() == _tok("abc")
    assert batches[0].attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert calib.parse_spec(str(path)) == ("text", str(path))


def test_jsonl_fields_and_token_ids(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [{"text": "hello"}, {"prompt": "p", "other": 1}, {"input_ids": [5, 6, 7]}, "bare"]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    b = _batches(str(path), batch_size=10)[0]
    assert b.attention_mask.sum(1).tolist() == [5, 1, 3, 4]
    assert b.input_ids[2, :3].tolist() == [5, 6, 7]
    (tmp_path / "f.jsonl").write_text(json.dumps({"body": "xy"}) + "\n")
    assert _batches(f"jsonl:{tmp_path / 'f.jsonl'}#body")[0].real_tokens == 2
    with pytest.raises(CalibrationError, match="no text/content/prompt/input_ids"):
        _batches(str(tmp_path / "f.jsonl"))


def test_tokenized_directory(tmp_path):
    ids = np.arange(40, dtype=np.int32).reshape(4, 10) + 4
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    np.save(tmp_path / "input_ids.npy", ids)
    np.save(tmp_path / "attention_mask.npy", mask)
    assert calib.parse_spec(str(tmp_path)) == ("tokenized", str(tmp_path))
    batches = _batches(str(tmp_path), tokenize=None, seq_len=10)
    assert [b.attention_mask.sum(1).tolist() for b in batches] == [[10, 6, 10, 10]]
    one_d = tmp_path / "flat"
    one_d.mkdir()
    np.save(one_d / "input_ids.npy", np.arange(4, 54))
    assert [b.input_ids.shape for b in _batches(f"tokenized:{one_d}", tokenize=None, seq_len=16)] == [(4, 16)]


def test_max_tokens_exact_and_seq_len(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("\n".join("x" * 50 for _ in range(10)))
    batches = _batches(str(path), max_tokens=123, seq_len=20, batch_size=3)
    assert sum(b.real_tokens for b in batches) == 123
    assert all(b.input_ids.shape[1] <= 20 for b in batches)


def test_random_source_and_registry():
    b = _batches("random:3", tokenize=None, max_tokens=64, seq_len=16)
    assert sum(x.real_tokens for x in b) == 64 and all((x.input_ids < 260).all() for x in b)
    calib.register_calibration_source("unit_test_src", lambda arg: [arg] * 3)
    try:
        assert sum(x.real_tokens for x in _batches("unit_test_src:abcd")) == 12
    finally:
        del calib.CALIBRATION_SOURCES["unit_test_src"]
    assert sum(x.real_tokens for x in _batches(["ab", [9, 9, 9]])) == 5  # a Python iterable works too


def test_errors(tmp_path):
    with pytest.raises(CalibrationError, match="does not exist"):
        calib.validate_spec(str(tmp_path / "missing.txt"))
    with pytest.raises(CalibrationError, match="unknown calibration source"):
        calib.parse_spec("nosuch:thing")
    with pytest.raises(CalibrationError, match="no tokens"):
        _batches([])
    with pytest.raises(CalibrationError, match="outside the vocabulary"):
        _batches([[1, 2, 999]])
    with pytest.raises(CalibrationError, match="no tokenizer"):
        _batches(["text"], tokenize=None)
    with pytest.raises(CalibrationError, match="at least 2"):
        calib.split_heldout(_batches(["ab"]), 0.2)
    train, held = calib.split_heldout(_batches([[5] * 4] * 20, batch_size=2), 0.2)
    assert (len(train), len(held)) == (8, 2)
