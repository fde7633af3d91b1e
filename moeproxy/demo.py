"""Demo runs: two recorded GRPO runs of the reproduction engine, posted over REST.

The traces in ``moeproxy/demo_data/`` were recorded once with

    moeproxy reproduce --model qwen3-moe-64e-rl --fault rollout_logp_precision \\
        --variant bf16 --param onset=40 --steps 100 --seeds 7 --out DIR

i.e. real RL runs (rollout engine, GRPO trainer, weight sync) of the project's own small
Qwen3-MoE RL starting point (64 experts, top-4, 8 layers; ``use: rl``, docs/reproduction.md) on
the synthetic reasoning tasks under that checkpoint's own RL setting, logged under verl's metric
names: a healthy run that learns (the reward's accuracy part rises from 0.46 over the first 20
steps to 0.58 over the last 20, entropy falls 0.095 -> 0.071, the KL loss grows 0.020 -> 0.064),
and its twin whose rollout engine computes log-probs in bf16 from step 40 (SPEC section 3,
``rollout_logp_precision``: the rollout-training probability difference leaves fp32 round-off for
~1e-3). Seed 7 is used by neither the shipped fingerprint library nor the diagnosis benchmark.

What the shipped library (campaign v2) says about them (``moeproxy triage FILE``, 2026-12-06): both
rank the right class first, and both weakly (the verl view's strong threshold is 0.90). The healthy
run: ``healthy`` 0.89, ``reward_fault`` 0.81 next; the bf16 run: ``rollout_logp_precision`` 0.87,
with ``operator_numeric_noise`` 0.76 and ``routing_mismatch`` 0.74 next. The engine names the right
class and says it is not sure — what the product does on a run it has never seen.
They are not production runs: every demo run carries the tag ``demo`` and ``config.demo = true``
with the recording command.

Shipping recordings keeps the light install (no torch) able to show the product on real engine
output; a fresh recording needs the ``[ml]`` extra and ~7 minutes of one CPU core.

This module talks to the service over HTTP only (it is client-side code).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moeproxy.client import encode_value

DEMO_PROJECT = "demo"
DATA_DIR = Path(__file__).resolve().parent / "demo_data"
RECORDED_WITH = (
    "moeproxy reproduce --model qwen3-moe-64e-rl --fault rollout_logp_precision "
    "--variant bf16 --param onset=40 --steps 100 --seeds 7"
)
DEMO_NOTE = ("recorded GRPO run of the moeproxy reproduction engine on the qwen3-moe-64e-rl reference model "
             "(synthetic task suite); a demo, not a production run")


class DemoDataMissing(FileNotFoundError):
    """The recorded demo traces are not where the package keeps them."""


@dataclass(frozen=True)
class DemoRun:
    name: str
    fault: str  # a SPEC section 3 class, "healthy" for the reference run
    steps: dict[int, dict[str, float | str]]
    onset_step: int | None = None
    model: str = "qwen3-moe-64e-rl"
    framework: str = "verl"

    def run_spec(self) -> dict:
        config: dict = {
            "demo": True,
            "note": DEMO_NOTE,
            "recorded_with": RECORDED_WITH,
            "algorithm": "grpo",
            "injected_fault": self.fault,
        }
        if self.onset_step is not None:
            config["onset_step"] = self.onset_step
        return {
            "name": self.name,
            "framework": self.framework,
            "model": self.model,
            "tags": ["demo", "reproduction-engine", self.fault],
            "config": config,
        }


#: (run name, fault class, trace file, onset step)
DEMO_RUNS: tuple[tuple[str, str, str, int | None], ...] = (
    ("demo-grpo-qwen3-moe-64e-rl-healthy", "healthy", "healthy-seed7.jsonl", None),
    ("demo-grpo-qwen3-moe-64e-rl-bf16-rollout", "rollout_logp_precision", "rollout_logp_precision-seed7.jsonl", 40),
)


def _read_trace(path: Path) -> dict[int, dict[str, float | str]]:
    """A reproduction trace: one ``{"step": int, "values": {name: number}}`` per line (non-finite
    values as the strings "NaN"/"Infinity"/"-Infinity", exactly as the REST body takes them)."""
    if not path.exists():
        raise DemoDataMissing(f"demo trace {path} is missing; reinstall moeproxy or record it with `{RECORDED_WITH}`")
    steps: dict[int, dict[str, float | str]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            # json.loads reads NaN/Infinity literals as floats, which a strict JSON encoder refuses;
            # the REST body takes them as the strings of SPEC section 5.
            steps[int(item["step"])] = {k: encode_value(float(v)) for k, v in item["values"].items()}
    return steps


def demo_runs(data_dir: Path = DATA_DIR) -> list[DemoRun]:
    """The two recorded demo runs."""
    return [DemoRun(name, fault, _read_trace(data_dir / file), onset_step=onset)
            for name, fault, file, onset in DEMO_RUNS]


def post_demo(
    url: str,
    token: str,
    *,
    batch_steps: int = 16,
    progress: Callable[[str], None] | None = None,
    timeout_s: float = 30.0,
) -> list[dict]:
    """Create the demo runs on the service at ``url`` and post their metrics; returns the runs as JSON."""
    import httpx

    posted = []
    with httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s) as http:
        for run in demo_runs():
            response = http.post("/api/v1/runs", json=run.run_spec())
            response.raise_for_status()
            info = response.json()
            steps = sorted(run.steps)
            for start in range(0, len(steps), batch_steps):
                chunk = [{"step": s, "values": run.steps[s]} for s in steps[start : start + batch_steps]]
                http.post(f"/api/v1/runs/{info['id']}/metrics", json={"steps": chunk}).raise_for_status()
            if progress is not None:
                progress(f"posted {run.name} ({len(steps)} steps, recorded engine run)")
            posted.append(info)
    return posted
