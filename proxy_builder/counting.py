"""Parameter-count formulas of the MoE building blocks (attention flavours, SwiGLU experts).

Pure functions of a config; :mod:`moeproxy.proxy_builder.architectures` names, per
architecture entry, which of them apply, and :mod:`moeproxy.proxy_builder.params`
sums them.  Pure Python: imports nothing from the project.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Config = Mapping[str, Any]


def head_dim(cfg: Config) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def gqa_attention(*, qkv_bias_key: str, o_bias_key: str | None, qk_norm: str | None) -> Callable:
    """q/k/v/o projections with grouped KV heads.

    ``qk_norm``: ``"head"`` (Qwen3: RMSNorm over head_dim) or ``"full"`` (OLMoE:
    RMSNorm over all q heads and all kv heads).
    """

    def count(cfg: Config) -> tuple[int, int]:
        h, hd = cfg["hidden_size"], head_dim(cfg)
        q_out = cfg["num_attention_heads"] * hd
        kv_out = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        kv_out *= hd
        qkv_bias = bool(cfg.get(qkv_bias_key, qkv_bias_key == "qkv_bias"))
        o_bias = bool(cfg.get(o_bias_key, False)) if o_bias_key else False
        params = h * q_out + 2 * h * kv_out + q_out * h
        if qkv_bias:
            params += q_out + 2 * kv_out
        if o_bias:
            params += h
        norms = {"head": 2 * hd, "full": q_out + kv_out, None: 0}[qk_norm]
        return params, norms

    return count


def mla_attention(cfg: Config) -> tuple[int, int]:
    """DeepSeek multi-head latent attention (+ the V3.2 sparse-attention indexer).

    MLA's own norms (q_a_layernorm, kv_a_layernorm) are counted with attention.
    """
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    q_lora, kv_lora = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    bias = bool(cfg.get("attention_bias", False))
    qk_head = nope + rope
    if q_lora:
        params = h * q_lora + (q_lora if bias else 0) + q_lora + q_lora * nh * qk_head  # q_a, q_a_norm, q_b
    else:
        params = h * nh * qk_head
    params += h * (kv_lora + rope) + ((kv_lora + rope) if bias else 0)  # kv_a_proj_with_mqa
    params += kv_lora  # kv_a_layernorm
    params += kv_lora * nh * (nope + v)  # kv_b_proj
    params += nh * v * h + (h if bias else 0)  # o_proj
    if cfg.get("index_n_heads"):  # DeepSeek-V3.2 DSA lightning indexer
        n, d = cfg["index_n_heads"], cfg["index_head_dim"]
        params += q_lora * n * d + h * d + 2 * d + h * n  # wq_b, wk, k_norm (LayerNorm w+b), weights_proj
    return params, 0


def swiglu(h: int, i: int) -> int:
    return 3 * h * i  # gate, up, down
