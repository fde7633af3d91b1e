"""The character-level tokenizer of the reference models.

A real Hugging Face tokenizer: a ``tokenizers`` WordLevel model over single
characters (every character is its own pre-token), wrapped in
``PreTrainedTokenizerFast``, so ``save_pretrained`` writes ``tokenizer.json`` and
``AutoTokenizer.from_pretrained(dir)`` loads it back without this module.

Special tokens: ``<pad>`` (id 0), ``<bos>`` (1, added in front of every encoded
text), ``<eos>`` (2, the task suite's end-of-answer marker), ``<unk>`` (3).
Padding is on the left so batched greedy generation works as it is.

Imports ``tokenizers``/``transformers`` inside the functions that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moeproxy.reproduction.tasks import END_MARKER, Example, format_prompt, format_text

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "BOS",
    "CHARACTERS",
    "END_MARKER",
    "EOS",
    "PAD",
    "SPECIAL_TOKENS",
    "UNK",
    "VOCAB",
    "VOCAB_SIZE",
    "Example",
    "build_tokenizer",
    "format_prompt",
    "format_text",
]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", END_MARKER, "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
#: Every character the task suite writes, plus a few spares for user prompts. ``<``/``>`` are the
#: reasoning format's tags (``<t>…</t><a>…</a>``) and ``!`` the filler a degenerate policy repeats;
#: they come last so the ids of the older characters (and of checkpoints trained before) stay put.
CHARACTERS = "0123456789abcdefghijklmnopqrstuvwxyz+-*=:()[]{} ,.?/<>!"
VOCAB: dict[str, int] = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
#: The models' embedding size: the vocabulary rounded up to a multiple of 8.
VOCAB_SIZE = (len(VOCAB) + 7) // 8 * 8


def _backend():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel(vocab=dict(VOCAB), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters join without spaces
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, VOCAB[BOS])]
    )
    return tok


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh tokenizer; identical on every call (the vocabulary is fixed)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=_backend(),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        model_max_length=128,
    )
    return tok
