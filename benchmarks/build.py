"""Proxy-builder benchmark: statistics throughput, surgery time and surgery peak RSS (issue 4).

Builds a random Qwen3-MoE checkpoint of a few hundred MB under /tmp (never in
the repository), then measures, side by side in one run:

- routing-statistics throughput (real tokens/s) of ``collect_statistics``, and
  the same forward passes without hooks, so the hook overhead is a ratio;
- checkpoint surgery (``write_proxy_checkpoint``) in a fresh subprocess, so its
  peak RSS is the surgery's own (plus the interpreter), compared with the
  largest shard: the target is peak RSS <= 2 x largest shard.  The child reads
  VmHWM from /proc (getrusage's ru_maxrss keeps the forked parent's high-water
  mark across exec on Linux, which would count the benchmark's own model).

Medians of ``--repeats`` runs.  Prints the figures and writes
``benchmarks/results/build.json``.

    nice -n 10 python benchmarks/build.py            # ~400 MB model, bf16, 5 shards
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics as st
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

RESULTS = Path(__file__).resolve().parent / "results" / "build.json"

MODEL_CONFIG = {
    "model_type": "qwen3_moe",
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "num_experts": 64,
    "num_experts_per_tok": 4,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}

_SURGERY_CHILD = r"""
import json, sys, time
from pathlib import Path
from moeproxy.proxy_builder.architectures import architecture_for
from moeproxy.proxy_builder.checkpoint import open_checkpoint
from moeproxy.proxy_builder.surgery import write_proxy_checkpoint
from moeproxy.proxy_builder.process_memory import peak_rss_mb
src, out, keep = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
base_rss = peak_rss_mb()
config = json.loads((src / "config.json").read_text())
arch = architecture_for(config)
ckpt = open_checkpoint(src)
selections = {layer: list(range(0, 2 * keep, 2)) for layer in arch.moe_layers(config)}
out.mkdir()
t = time.perf_counter()
res = write_proxy_checkpoint(ckpt, out, arch, selections, keep)
elapsed = time.perf_counter() - t
print(json.dumps({"time_s": elapsed, "peak_rss_mb": peak_rss_mb(),
                  "import_rss_mb": base_rss, "bytes_written": res.bytes_written}))
"""


def build_model(root: Path, dtype: str, shard: str) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = root / "model"
    if (out / "config.json").is_file():
        return out
    cfg = dict(MODEL_CONFIG)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(getattr(torch, dtype))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 0.5)
    model.save_pretrained(out, max_shard_size=shard)
    return out


def bench_statistics(model_dir: Path, tokens: int, seq_len: int, batch: int, repeats: int) -> dict:
    import numpy as np
    import torch
    from moeproxy.proxy_builder.architectures import architecture_for
    from moeproxy.proxy_builder.build import load_model
    from moeproxy.proxy_builder.layer_stats import Batch
    from moeproxy.proxy_builder.statistics import collect_statistics

    torch.set_num_threads(1)
    model, _ = load_model(model_dir, dtype="float32")
    config = json.loads((model_dir / "config.json").read_text())
    arch = architecture_for(config)
    layers = arch.moe_layers(config)
    rng = np.random.default_rng(0)
    n_batches = max(1, tokens // (seq_len * batch))
    batches = [
        Batch(rng.integers(0, config["vocab_size"], size=(batch, seq_len)), np.ones((batch, seq_len), np.int64))
        for _ in range(n_batches)
    ]
    real = n_batches * batch * seq_len
    def hooked() -> None:
        collect_statistics(model, batches, arch, layers)

    def forward_only() -> None:
        with torch.no_grad():
            for b in batches:
                model(input_ids=torch.as_tensor(b.input_ids), attention_mask=torch.as_tensor(b.attention_mask),
                      use_cache=False)  # fmt: skip

    forward_only()  # warm-up, not timed
    with_hooks, plain = [], []
    for i in range(repeats):
        # Alternate the order (ABBA...) so drift on the shared machine hits both sides alike.
        for name, fn in (("hooked", hooked), ("plain", forward_only))[:: 1 if i % 2 == 0 else -1]:
            t = time.perf_counter()
            fn()
            (with_hooks if name == "hooked" else plain).append(time.perf_counter() - t)
    h, p = st.median(with_hooks), st.median(plain)
    return {
        "tokens": real,
        "seq_len": seq_len,
        "batch_size": batch,
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "time_s": h,
        "tokens_per_s": real / h,
        "forward_only_tokens_per_s": real / p,
        "hook_overhead_ratio": h / p,
        "repeats": repeats,
        "runs_s": {"hooked": with_hooks, "forward_only": plain},
    }


def bench_surgery(model_dir: Path, root: Path, keep: int, repeats: int) -> dict:
    from moeproxy.proxy_builder.checkpoint import open_checkpoint

    ckpt = open_checkpoint(model_dir)
    runs = []
    for i in range(repeats):
        out = root / f"proxy-{i}"
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.run(
            [sys.executable, "-c", _SURGERY_CHILD, str(model_dir), str(out), str(keep)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    _check_loads(root / "proxy-0")
    largest_mb = ckpt.largest_shard_bytes / 2**20
    peak = st.median(r["peak_rss_mb"] for r in runs)
    return {
        "keep": keep,
        "num_experts": MODEL_CONFIG["num_experts"],
        "checkpoint_mb": sum(s.path.stat().st_size for s in ckpt.shards) / 2**20,
        "shards": len(ckpt.shards),
        "largest_shard_mb": largest_mb,
        "proxy_mb": runs[0]["bytes_written"] / 2**20,
        "time_s": st.median(r["time_s"] for r in runs),
        "peak_rss_mb": peak,
        "interpreter_rss_mb": st.median(r["import_rss_mb"] for r in runs),
        "peak_rss_over_largest_shard": peak / largest_mb,
        "target_met": peak <= 2 * largest_mb,
        "repeats": repeats,
    }


FIDELITY_VARIANTS: dict[str, dict] = {
    "three_view": {"method": "three_view"},
    "three_view/medoid": {"method": "three_view", "representative": "medoid"},
    "three_view_unweighted": {"method": "three_view_unweighted"},
    "frequency": {"method": "frequency"},
    "random": {"method": "random"},
    "first_k": {"method": "first_k"},
}


def bench_fidelity(
    model_dir: Path,
    keep: int,
    tokens: int,
    heldout_tokens: int,
    seq_len: int,
    calibration: str | None = None,
) -> dict:
    """Next-token KL(original || proxy) of each selection variant, side by side, on held-out batches.

    Without ``calibration`` the tokens are random; on the random-initialised
    benchmark model this only checks the pipeline (see docs/benchmarks.md).  With
    a calibration spec (e.g. ``synthetic:tasks`` on a trained reference model) the
    last ``heldout_tokens`` of the stream are held out and never used for statistics.
    """
    import numpy as np
    import torch
    from moeproxy.proxy_builder import calibration as calib
    from moeproxy.proxy_builder.architectures import architecture_for, group_spec
    from moeproxy.proxy_builder.build import load_model
    from moeproxy.proxy_builder.layer_stats import Batch
    from moeproxy.proxy_builder.methods import SelectionOptions, select_experts
    from moeproxy.proxy_builder.statistics import collect_statistics, next_token_kl
    from moeproxy.proxy_builder.weight_search import in_memory_proxy

    torch.set_num_threads(1)
    model, tokenizer = load_model(model_dir, dtype="float32", progress=False)
    config = json.loads((model_dir / "config.json").read_text())
    arch = architecture_for(config)
    layers = arch.moe_layers(config)
    group = group_spec(arch, config, keep, "per_group")
    if calibration is None:
        rng = np.random.default_rng(1)

        def batches(n_tokens: int) -> list:
            n = max(1, n_tokens // (4 * seq_len))
            return [Batch(rng.integers(0, config["vocab_size"], size=(4, seq_len)), np.ones((4, seq_len), np.int64))
                    for _ in range(n)]  # fmt: skip

        stats_batches, held = batches(tokens), batches(heldout_tokens)
    else:
        from moeproxy.cli.build import _register_lazy_sources

        _register_lazy_sources()
        everything = calib.make_batches(
            calib.documents(calibration),
            tokenize=lambda text: tokenizer(text, add_special_tokens=True)["input_ids"],
            vocab_size=config["vocab_size"], max_tokens=tokens + heldout_tokens, seq_len=seq_len, batch_size=16,
            pad_id=tokenizer.pad_token_id or 0,
        )  # fmt: skip
        stats_batches, held = calib.split_heldout(everything, heldout_tokens / (tokens + heldout_tokens))
    stats = collect_statistics(model, stats_batches, arch, layers)
    out = {}
    for name, variant in FIDELITY_VARIANTS.items():
        options = SelectionOptions(representative=variant.get("representative", "most_frequent"))
        sel = select_experts(variant["method"], stats, layers, arch.expert_count(config), keep, options, group=group)
        proxy = in_memory_proxy(model, arch, {k: v.kept for k, v in sel.items()}, keep, group)
        mass = float(np.mean([stats[layer].mass_kept(sel[layer].kept) for layer in layers]))
        out[name] = {"kl": next_token_kl(model, proxy, held), "routing_mass_kept": mass}
        del proxy
    return {
        "model": str(model_dir),
        "calibration": calibration or "random tokens",
        "keep": keep,
        "num_experts": arch.expert_count(config),
        "calibration_tokens": sum(b.real_tokens for b in stats_batches),
        "heldout_tokens": sum(b.real_tokens for b in held),
        "variants": out,
    }


def _check_loads(proxy: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(proxy)
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("/tmp/moeproxy-bench-build"))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shard", default="100MB")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--keep", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--fidelity-model", type=Path, help="Only run the fidelity comparison, on this checkpoint.")
    ap.add_argument("--fidelity-calibration", default="synthetic:tasks")
    ap.add_argument("--fidelity-keep", type=int, default=None)
    ap.add_argument("--ablation-steps", type=int, default=0,
                    help="Only run the method ablation on a Qwen3-MoE trained this many steps.")
    args = ap.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    if args.fidelity_model is not None:
        _fidelity_only(args)
        return
    if args.ablation_steps:
        _merge_result("ablation", run_ablation(args.root, args.ablation_steps, (16, 32)))
        return

    t = time.perf_counter()
    model_dir = build_model(args.root, args.dtype, args.shard)
    build_s = time.perf_counter() - t
    surgery = bench_surgery(model_dir, args.root, args.keep, args.repeats)
    stats = bench_statistics(model_dir, args.tokens, args.seq_len, args.batch_size, args.repeats)
    fidelity = bench_fidelity(model_dir, args.keep, 4096, 1024, args.seq_len)
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "model": {**MODEL_CONFIG, "dtype": args.dtype, "build_s": build_s},
        "statistics": stats,
        "surgery": surgery,
        "fidelity": fidelity,
        "command": "nice -n 10 python benchmarks/build.py " + " ".join(sys.argv[1:]),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"statistics: {stats['tokens_per_s']:,.0f} tok/s with hooks, {stats['forward_only_tokens_per_s']:,.0f} "
          f"tok/s forward only (overhead x{stats['hook_overhead_ratio']:.3f})")  # fmt: skip
    print(f"surgery: {surgery['checkpoint_mb']:.0f} MB in {surgery['shards']} shards -> {surgery['proxy_mb']:.0f} MB "
          f"in {surgery['time_s']:.2f} s; peak RSS {surgery['peak_rss_mb']:.0f} MB = "
          f"{surgery['peak_rss_over_largest_shard']:.2f} x largest shard ({surgery['largest_shard_mb']:.0f} MB); "
          f"target <= 2x {'met' if surgery['target_met'] else 'MISSED'}")  # fmt: skip
    for name, row in fidelity["variants"].items():
        print(f"fidelity {name:22} KL {row['kl']:.4f}  routing mass kept {row['routing_mass_kept']:.3f}")
    print(f"wrote {RESULTS}")


ABLATION_VARIANTS: dict[str, dict] = {
    "three_view": {"method": "three_view"},
    "three_view/medoid": {"method": "three_view", "representative": "medoid"},
    "three_view_unweighted": {"method": "three_view_unweighted"},
    "router": {"method": "router"},
    "coact_proto": {"method": "coact_proto"},
    "frequency": {"method": "frequency"},
    "random": {"method": "random"},
    "first_k": {"method": "first_k"},
}


def run_ablation(root: Path, steps: int, keeps: tuple[int, ...]) -> dict:
    """Selection methods and representative rules on a briefly trained Qwen3-MoE reference recipe.

    Trains the reproduction stage's Qwen3-MoE recipe (64 experts, top-4) for ``steps``
    steps under ``root``, builds a proxy per variant and keep, and scores it with the
    evaluation harness (held-out task accuracy, retention, next-token KL).
    """
    import torch
    from moeproxy.proxy_builder.build import BuildRequest, build_proxy
    from moeproxy.reproduction.fidelity import EvalSettings, evaluate_pair
    from moeproxy.reproduction.reference import TrainingRecipe, save_checkpoint, train_model
    from moeproxy.reproduction.tasks import calibration_corpus

    torch.set_num_threads(1)
    original = root / f"ablation-qwen3-{steps}"
    recipe = TrainingRecipe(steps=steps, batch_size=32, lr=3e-3, warmup_steps=50, save_dtype="float32")
    if not (original / "config.json").is_file():
        result = train_model("qwen3_moe", recipe, log_every=100,
                             progress=lambda step, m: print(f"train step {step} loss {m['loss']:.3f}", flush=True))
        save_checkpoint(result, original, recipe, {"arch": "qwen3_moe"})
    settings = EvalSettings(prompts_per_task=60, kl_texts_per_task=20, batch_size=128, measure_cost=False)
    calibration = calibration_corpus(1500, seed=0)
    rows: dict[str, dict] = {}
    for keep in keeps:
        for name, variant in ABLATION_VARIANTS.items():
            out = root / f"ablation-{steps}-{keep}-{name.replace('/', '_')}"
            if not out.exists():
                build_proxy(
                    BuildRequest(
                        original,
                        out,
                        keep=keep,
                        calibration=calibration,
                        max_tokens=20000,
                        seq_len=64,
                        batch_size=32,
                        **variant,
                    )
                )  # fmt: skip
            rep = evaluate_pair(original, out, settings)
            rows[f"{keep}:{name}"] = {
                "keep": keep,
                "variant": name,
                "original_accuracy": rep["original"]["mean_accuracy"],
                "proxy_accuracy": rep["proxy"]["mean_accuracy"],
                "retention": rep["retention"],
                "kl": rep["kl"],
            }
            print(f"ablation keep {keep:3} {name:22} acc {rows[f'{keep}:{name}']['proxy_accuracy']:.3f} "
                  f"(original {rep['original']['mean_accuracy']:.3f}) KL {rep['kl']:.4f}", flush=True)  # fmt: skip
    return {"steps": steps, "batch_size": recipe.batch_size, "prompts_per_task": settings.prompts_per_task,
            "rows": rows}  # fmt: skip


def _merge_result(key: str, value: dict) -> None:
    result = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    result[key] = value
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


def _fidelity_only(args) -> None:
    """Add a fidelity table for a given (e.g. trained reference) model to the results file."""
    config = json.loads((args.fidelity_model / "config.json").read_text())
    from moeproxy.proxy_builder.architectures import architecture_for

    keep = args.fidelity_keep or architecture_for(config).expert_count(config) // 4
    fidelity = bench_fidelity(args.fidelity_model, keep, 8192, 2048, 128, calibration=args.fidelity_calibration)
    models = json.loads(RESULTS.read_text()).get("fidelity_models", {}) if RESULTS.is_file() else {}
    models[args.fidelity_model.name] = fidelity
    _merge_result("fidelity_models", models)
    for name, row in fidelity["variants"].items():
        print(f"fidelity {name:22} KL {row['kl']:.4f}  routing mass kept {row['routing_mass_kept']:.3f}")


if __name__ == "__main__":
    main()
