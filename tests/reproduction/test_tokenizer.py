"""The character tokenizer is a real HF tokenizer that round-trips every task text."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from moeproxy.reproduction.tasks import END_MARKER, format_prompt, format_text, make_split
from moeproxy.reproduction.tokenizer import (
    BOS,
    EOS,
    PAD,
    VOCAB,
    VOCAB_SIZE,
    build_tokenizer,
)
from transformers import AutoTokenizer


def test_special_tokens_and_vocab():
    tok = build_tokenizer()
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == (PAD, BOS, EOS)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert EOS == END_MARKER
    assert len(tok) == len(VOCAB) <= VOCAB_SIZE
    assert tok.padding_side == "left"


def test_round_trip_of_every_task_text():
    tok = build_tokenizer()
    for ex in make_split("heldout", 140, seed=3):
        text = format_text(ex)
        ids = tok(text).input_ids
        assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
        # one token per character between <bos> and <eos>
        assert len(ids) == 1 + len(ex.prompt) + len(ex.answer) + 1
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == BOS + text
        assert tok.decode(ids, skip_special_tokens=True) == ex.prompt + ex.answer
        assert tok.decode(tok(format_prompt(ex)).input_ids[1:]) == ex.prompt


def test_spaces_are_tokens():
    tok = build_tokenizer()
    ids = tok("count a:ab").input_ids
    assert tok.convert_ids_to_tokens(ids)[1:7] == ["c", "o", "u", "n", "t", " "]
    assert tok.decode(ids, skip_special_tokens=True) == "count a:ab"


def test_unknown_character_maps_to_unk():
    tok = build_tokenizer()
    assert tok("A").input_ids == [tok.bos_token_id, tok.unk_token_id]


def test_left_padding_batch():
    tok = build_tokenizer()
    batch = tok(["1+1=", "rev:abc="], padding=True, return_tensors=None)
    assert batch.input_ids[0][:4] == [tok.pad_token_id] * 4
    assert batch.attention_mask[0][:4] == [0] * 4
    assert batch.input_ids[0][4] == tok.bos_token_id


def test_save_and_load_with_auto_tokenizer(tmp_path):
    tok = build_tokenizer()
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").exists()
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "sort:3120=0123" + END_MARKER
    assert loaded(text).input_ids == tok(text).input_ids
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    assert loaded.padding_side == "left"
    assert loaded.decode(loaded(text).input_ids, skip_special_tokens=True) == "sort:3120=0123"
