"""The fresh process behind :func:`~moeproxy.reproduction.fidelity.measure_peak_memory_mb`: load a
checkpoint in fp32 and generate for a batch of prompts, print the peak RSS of that, the RSS before
it and their difference as one JSON line.

    python -m moeproxy.reproduction.memory.generation_rss_child MODEL_DIR PROMPTS_JSON

A process of its own because in one long process freed pages stay mapped, which hides differences.
RSS is read through :mod:`moeproxy.proxy_builder.process_memory`, the one reader of every stage.
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Sequence


def _hand_back_freed_memory() -> None:
    """Return freed heap pages to the kernel (glibc), so they do not count in the measured round."""
    import ctypes

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass


def main(argv: Sequence[str] | None = None) -> None:
    model_dir, prompts_json = argv if argv is not None else sys.argv[1:]
    import torch

    torch.set_num_threads(1)
    from moeproxy.proxy_builder.process_memory import current_rss_mb, peak_rss_mb, reset_peak_rss
    from moeproxy.reproduction.tasks import MAX_ANSWER_CHARS
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    enc = tok(json.loads(prompts_json), padding=True, return_tensors="pt")
    new_tokens = MAX_ANSWER_CHARS + 1  # the longest answer and its end marker

    def load_and_generate():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            model.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        return model

    # A first round pulls in the lazily imported modelling code and warms caches; its memory is freed
    # and handed back before the measured round.
    load_and_generate()
    _hand_back_freed_memory()
    hwm_reset = reset_peak_rss()  # so import-time peaks do not hide the model
    base = current_rss_mb()
    load_and_generate()
    peak = peak_rss_mb()  # a high-water mark: the measured round's peak, though its model is freed
    print(json.dumps({"peak_rss_mb": peak, "rss_before_load_mb": base, "run_mb": peak - base,
                      "hwm_reset": hwm_reset}))


if __name__ == "__main__":
    main()
