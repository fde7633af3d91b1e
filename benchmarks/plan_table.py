"""Original-vs-proxy resource table for every preset, and the sensitivity of the
paper's two figures to each planner assumption (issue 9).

    python benchmarks/plan_table.py               # print both tables
    python benchmarks/plan_table.py --write-docs  # also refresh docs/planner.md

Writes benchmarks/results/plan_table.json.  Pure arithmetic on configs: no
device, no timing.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

from moeproxy.proxy_builder.plan import PlanAssumptions, load_preset, plan

from moeproxy.cli.plan import markdown_table

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "planner.md"
RESULT = ROOT / "benchmarks" / "results" / "plan_table.json"

# Experts kept per preset: the paper's choices where it made one, otherwise a
# comparable fraction (Mixtral has only 8 experts with top-2 routing).
KEEPS: list[tuple[str, int, str]] = [
    ("qwen3-30b-a3b", 48, "paper: 16 -> 8 NPUs"),
    ("qwen3-30b-a3b", 64, "paper ablation"),
    ("qwen3-235b-a22b", 48, "same fraction as the 30B"),
    ("deepseek-v3.2", 16, "paper: 512 -> 64 NPUs"),
    ("deepseek-v3", 16, "as V3.2"),
    ("qwen2-57b-a14b", 16, "1/4 of the experts"),
    ("mixtral-8x7b", 4, "half the experts"),
    ("olmoe-1b-7b", 16, "1/4 of the experts"),
]

PAPER = [("qwen3-30b-a3b", 48, (16, 8)), ("deepseek-v3.2", 16, (512, 64))]

# One assumption changed at a time, to show how much room the defaults leave.
VARIANTS: list[tuple[str, dict]] = [
    ("defaults", {}),
    ("usable fraction 0.85", {"usable_memory_fraction": 0.85}),
    ("usable fraction 0.95", {"usable_memory_fraction": 0.95}),
    ("fp32 gradients (4 B)", {"grad_bytes": 4.0}),
    ("rollout weights offloaded (0 B)", {"rollout_weight_bytes": 0.0}),
    ("no reference copy (0 B)", {"reference_bytes": 0.0}),
    ("seq_len 2048", {"seq_len": 2048}),
    ("seq_len 8192", {"seq_len": 8192}),
    ("rollout batch 128", {"rollout_batch": 128}),
    ("rollout batch 1024", {"rollout_batch": 1024}),
    ("16k train tokens / device", {"train_tokens_per_device": 16384}),
    ("48k train tokens / device", {"train_tokens_per_device": 49152}),
    ("80 GB devices", {"device_memory_gb": 80.0}),
]


def preset_rows() -> list[tuple[str, dict]]:
    return [(f"{name} ({note})", plan(load_preset(name), keep=keep).to_dict()) for name, keep, note in KEEPS]


def sensitivity() -> list[dict]:
    rows = []
    for label, change in VARIANTS:
        a = replace(PlanAssumptions(), **change)
        row = {"variant": label}
        for name, keep, _ in PAPER:
            p = plan(load_preset(name), keep=keep, assumptions=a)
            row[name] = {
                "original": p.original.devices,
                "proxy": p.proxy.devices,
                "original_raw": round(p.original.devices_raw, 1),
                "proxy_raw": round(p.proxy.devices_raw, 1),
            }
        rows.append(row)
    return rows


def sensitivity_markdown(rows: list[dict]) -> str:
    lines = [
        (
            "| assumption changed | Qwen3-30B-A3B, keep 48 (paper 16 -> 8) "
            "| DeepSeek-V3.2, keep 16 (paper 512 -> 64) |"
        ),
        "|---|---|---|",
    ]
    for r in rows:
        cells = []
        for name, _, target in PAPER:
            c = r[name]
            ok = (c["original"], c["proxy"]) == target
            flag = "" if ok else " **differs**"
            cells.append(f"{c['original']} -> {c['proxy']} ({c['original_raw']} -> {c['proxy_raw']}){flag}")
        lines.append(f"| {r['variant']} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def _replace_between(text: str, tag: str, body: str) -> str:
    start, end = f"<!-- {tag}:start -->", f"<!-- {tag}:end -->"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="refresh the tables in docs/planner.md")
    args = parser.parse_args()
    rows = preset_rows()
    sens = sensitivity()
    table, sens_md = markdown_table(rows), sensitivity_markdown(sens)
    print(table)
    print()
    print(sens_md)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(
        json.dumps(
            {
                "command": "python benchmarks/plan_table.py",
                "assumptions": asdict(PlanAssumptions()),
                "presets": dict(rows),
                "sensitivity": sens,
            },
            indent=2,
        )
        + "\n"
    )
    if args.write_docs:
        text = DOCS.read_text()
        text = _replace_between(text, "plan_table", table)
        text = _replace_between(text, "plan_sensitivity", sens_md)
        DOCS.write_text(text)
        print(f"\nupdated {DOCS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
