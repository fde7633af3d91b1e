"""Render the field set: one trace per spec in ``specs/``, ``labels.json`` and ``MANIFEST.sha256``.

The field set (issue 17, item 5) holds runs rebuilt from public reports about verl, TRL and
OpenRLHF. They are reconstructions, not real logs: each spec (``specs/<id>.json``) names its
sources, the values read from them (``read``) and the values chosen here (``chosen``), and says
how every logged metric moves, in the framework's own logger names. This script turns a spec into
the REST ingest body ``{"name", "framework", "steps": [{"step", "values"}]}`` (``traces/<id>.json``,
non-finite values as the JSON literals ``NaN``/``Infinity``), deterministically: numpy, one seed per
trace and one random stream per metric, drawn from the trace seed and the metric's name.

It uses numpy only: no part of the project (reproduction engine, fingerprints, matching) makes or
reads these traces, so the set stays independent of what it is used to evaluate.

    python benchmarks/field/build.py            # render traces/, labels.json, MANIFEST.sha256
    python benchmarks/field/build.py --check    # verify the manifest and that specs re-render the traces

A metric is ``{"base": ..., "noise": ..., "events": [...], "clip": [lo, hi], "sig": digits}``, or
``{"derive": {"sum": [names], "weights": [...]}}`` for a logged total of other metrics:

- ``base``: ``const`` (value), ``linear`` (start, end), ``plateau`` (start, end, tau: an exponential
  approach, ``tau`` in steps), ``sigmoid`` (start, end, mid, width), ``log`` (start, end: along
  ``log1p(t)``), ``schedule`` (a learning-rate schedule: ``constant``, ``linear`` (decay to 0 at the
  last step, as Hugging Face's default), ``cosine``, ``cosine_with_min_lr``; ``peak``,
  ``warmup`` steps, ``min_ratio``, ``total`` planned steps when the trace shows fewer).
- ``noise``: AR(1) with stationary standard deviation ``sd`` (times ``|value|`` when ``rel``) and
  coefficient ``phi``.
- ``events``, applied in order to the noise-free curve: ``level`` (move to ``to`` over ``ramp``
  steps), ``scale`` (multiply by ``factor``, ramped), ``add`` (add ``value``, ramped), ``growth``
  (multiply by ``exp(rate * steps since)``, up to ``cap``), ``linear`` (add ``per_step`` per step),
  ``hold`` (keep the value reached at ``at``), ``sawtooth`` (add ``amplitude`` times the phase
  inside each ``period``), ``noise_scale`` (multiply the noise by ``factor``, ramped); then, after
  the noise: ``spikes`` (with probability ``prob`` per step, multiply by a log-uniform factor in
  ``factor``), the ``clip`` bounds, ``freeze`` (exactly ``value`` from ``at``), ``nonfinite``
  (``value`` ``nan``/``inf``/``-inf`` with probability ``prob`` per step, from ``at`` to ``until``).

Steps: ``at``/``until`` are logged step numbers. verl and OpenRLHF count from 0, TRL from 1
(``first_step``). A trace has ``steps`` logged steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SPECS = HERE / "specs"
TRACES = HERE / "traces"
LABELS = HERE / "labels.json"
MANIFEST = HERE / "MANIFEST.sha256"

#: Files whose hashes the manifest holds, as globs relative to this folder.
MANIFEST_GLOBS: tuple[str, ...] = ("README.md", "build.py", "labels.json", "specs/*.json", "traces/*.json")


class SpecError(ValueError):
    """A spec that cannot be rendered (unknown shape, event or framework; steps out of range)."""


# --- noise-free curves ----------------------------------------------------------------------------


def _schedule(p: Mapping[str, Any], n: int) -> np.ndarray:
    """Learning rate after each optimizer step, as the trainers' schedulers compute it."""
    kind, peak = p["schedule"], float(p["peak"])
    warmup, min_ratio = int(p.get("warmup", 0)), float(p.get("min_ratio", 0.0))
    total = int(p.get("total", n))  # the run's planned optimizer steps; a trace may show fewer
    s = np.arange(1, n + 1, dtype=float)  # scheduler steps taken when the value is logged
    warm = np.minimum(1.0, s / warmup) if warmup > 0 else np.ones(n)
    progress = np.clip((s - warmup) / max(1, total - warmup), 0.0, 1.0)
    if kind == "constant":
        decay = np.ones(n)
    elif kind == "linear":
        decay = 1.0 - progress
    elif kind == "cosine":
        decay = 0.5 * (1.0 + np.cos(math.pi * progress))
    elif kind == "cosine_with_min_lr":
        decay = min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + np.cos(math.pi * progress))
    else:
        raise SpecError(f"unknown schedule {kind!r}")
    return peak * np.where(s <= warmup, warm, decay)


def _base(p: Mapping[str, Any], n: int) -> np.ndarray:
    t = np.arange(n, dtype=float)
    kind = p["kind"]
    if kind == "const":
        return np.full(n, float(p["value"]))
    if kind == "schedule":
        return _schedule(p, n)
    a, b = float(p["start"]), float(p["end"])
    if kind == "linear":
        return a + (b - a) * t / max(1, n - 1)
    if kind == "plateau":
        return a + (b - a) * (1.0 - np.exp(-t / float(p["tau"])))
    if kind == "sigmoid":
        return a + (b - a) / (1.0 + np.exp(-(t - float(p["mid"])) / float(p["width"])))
    if kind == "log":
        return a + (b - a) * np.log1p(t) / math.log1p(max(1, n - 1))
    raise SpecError(f"unknown base {kind!r}")


def _ramp(i0: int, n: int, steps: int) -> np.ndarray:
    """0 before ``i0``, rising linearly to 1 over ``steps`` steps (a jump when 0)."""
    t = np.arange(n) - i0
    if steps <= 0:
        return (t >= 0).astype(float)
    return np.clip((t + 1) / steps, 0.0, 1.0) * (t >= 0)


def _since(i0: int, n: int) -> np.ndarray:
    return np.maximum(0, np.arange(n) - i0).astype(float)


def _apply_event(y: np.ndarray, noise_mult: np.ndarray, e: Mapping[str, Any], i0: int) -> None:
    n, kind = len(y), e["kind"]
    r = _ramp(i0, n, int(e.get("ramp", 0)))
    if kind == "level":
        y[:] = y + r * (float(e["to"]) - y)
    elif kind == "scale":
        y[:] = y * (1.0 + r * (float(e["factor"]) - 1.0))
    elif kind == "add":
        y[:] = y + r * float(e["value"])
    elif kind == "growth":
        grown = y * np.exp(float(e["rate"]) * _since(i0, n))
        if "cap" in e:  # a bound in the direction of growth (|y| grows for rate > 0)
            cap = float(e["cap"])
            grown = np.minimum(grown, cap) if cap >= 0 else np.maximum(grown, cap)
        y[:] = np.where(np.arange(n) >= i0, grown, y)
    elif kind == "linear":
        y[:] = y + float(e["per_step"]) * _since(i0, n)
    elif kind == "hold":
        if 0 <= i0 < n:
            y[i0:] = y[i0]
    elif kind == "sawtooth":
        period = int(e["period"])
        phase = (_since(i0, n) % period) / period
        y[:] = y + float(e["amplitude"]) * phase * (np.arange(n) >= i0)
    elif kind == "noise_scale":
        noise_mult[:] = noise_mult * (1.0 + r * (float(e["factor"]) - 1.0))
    else:
        raise SpecError(f"unknown event {kind!r}")


_POST_NOISE = ("spikes", "freeze", "nonfinite")
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def render_metric(shape: Mapping[str, Any], n: int, first_step: int, rng: np.random.Generator) -> np.ndarray:
    """One metric's values at the ``n`` logged steps."""
    y = _base(shape["base"], n)
    noise_mult = np.ones(n)
    events = shape.get("events", [])
    for e in events:
        if e["kind"] not in _POST_NOISE:
            _apply_event(y, noise_mult, e, int(e["at"]) - first_step)
    noise = shape.get("noise")
    if noise:
        sd, phi = float(noise["sd"]), float(noise.get("phi", 0.0))
        z = rng.standard_normal(n)
        ar = np.empty(n)
        ar[0] = z[0]
        for i in range(1, n):  # stationary AR(1): unit variance whatever phi is
            ar[i] = phi * ar[i - 1] + math.sqrt(1.0 - phi * phi) * z[i]
        scale = np.abs(y) if noise.get("rel") else 1.0
        y = y + sd * scale * noise_mult * ar
    idx = np.arange(n) + first_step
    for e in events:
        if e["kind"] == "spikes":
            lo, hi = (float(v) for v in e["factor"])
            window = (idx >= int(e["at"])) & (idx <= int(e.get("until", idx[-1])))
            hit = window & (rng.random(n) < float(e["prob"]))
            factor = np.exp(rng.uniform(math.log(lo), math.log(hi), n))
            y = np.where(hit, y * factor, y)
    lo, hi = (shape.get("clip") or [None, None])
    y = np.clip(y, -np.inf if lo is None else lo, np.inf if hi is None else hi)
    for e in events:
        window = (idx >= int(e["at"])) & (idx <= int(e.get("until", idx[-1])))
        if e["kind"] == "freeze":
            y = np.where(window, float(e["value"]), y)
        elif e["kind"] == "nonfinite":
            hit = window & (rng.random(n) < float(e.get("prob", 1.0)))
            y = np.where(hit, _NONFINITE[e.get("value", "nan")], y)
    return y


def _rounded(v: float, sig: int) -> float:
    return v if not math.isfinite(v) else float(f"{v:.{sig}g}")


# --- traces -----------------------------------------------------------------------------------------

FRAMEWORKS = ("verl", "trl", "openrlhf")
MIN_STEPS, MAX_STEPS = 60, 1000


def seed_of(spec: Mapping[str, Any]) -> int:
    """The trace's seed: CRC-32 of its id (a spec that states ``seed`` must state that value)."""
    seed = zlib.crc32(str(spec["id"]).encode())
    if int(spec.get("seed", seed)) != seed:
        raise SpecError(f"{spec['id']}: seed {spec['seed']} is not CRC-32 of the id ({seed})")
    return seed


def render(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The REST ingest body of one spec."""
    if spec["framework"] not in FRAMEWORKS:
        raise SpecError(f"{spec['id']}: unknown framework {spec['framework']!r}")
    n, first = int(spec["steps"]), int(spec.get("first_step", 0))
    if not MIN_STEPS <= n <= MAX_STEPS:
        raise SpecError(f"{spec['id']}: {n} steps, outside {MIN_STEPS}-{MAX_STEPS}")
    raw: dict[str, np.ndarray] = {}
    for name, shape in spec["metrics"].items():
        if "derive" not in shape:
            rng = np.random.default_rng([seed_of(spec), zlib.crc32(name.encode())])
            raw[name] = render_metric(shape, n, first, rng)
    for name, shape in spec["metrics"].items():
        if "derive" in shape:  # a logged total of other metrics (TRL's reward is the weighted sum of its functions)
            parts, weights = shape["derive"]["sum"], shape["derive"].get("weights")
            weights = weights or [1.0] * len(parts)
            raw[name] = sum(w * raw[p] for p, w in zip(parts, weights, strict=True))
    columns = {name: [_rounded(float(v), int(shape.get("sig", 6))) for v in raw[name]]
               for name, shape in spec["metrics"].items()}
    steps = [{"step": first + i, "values": {name: col[i] for name, col in columns.items()}} for i in range(n)]
    return {"name": spec["id"], "framework": spec["framework"], "steps": steps}


def dumps_trace(body: Mapping[str, Any]) -> str:
    """One step per line (diffable), NaN/Infinity as JSON literals (Python's json reads them).

    Step lines are indented: a line starting with ``{`` would make the file read as JSONL
    (``moeproxy.signatures.canonical.load_run`` tells the two apart that way)."""
    head = json.dumps({"name": body["name"], "framework": body["framework"]})[:-1]
    lines = ",\n".join(" " + json.dumps(s, allow_nan=True) for s in body["steps"])
    return f'{head}, "steps": [\n{lines}\n]}}\n'


def label_of(spec: Mapping[str, Any]) -> dict[str, Any]:
    onset = spec.get("onset")
    return {"label": spec["label"], "onset": onset, "framework": spec["framework"], "steps": int(spec["steps"]),
            "onset_kind": None if onset is None else ("start" if int(onset) == 0 else "late")}


def load_specs(folder: Path = SPECS) -> list[dict[str, Any]]:
    specs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    for p, s in zip(sorted(folder.glob("*.json")), specs, strict=True):
        if s["id"] != p.stem:
            raise SpecError(f"{p}: id {s['id']!r} differs from the file name")
    return specs


def rendered_files(specs: list[Mapping[str, Any]]) -> dict[Path, str]:
    """Every file the build writes (traces and labels), by path."""
    files = {TRACES / f"{s['id']}.json": dumps_trace(render(s)) for s in specs}
    labels = {s["id"]: label_of(s) for s in specs}
    files[LABELS] = json.dumps(labels, indent=1, sort_keys=True) + "\n"
    return files


def _manifest_paths() -> list[Path]:
    return sorted({p for g in MANIFEST_GLOBS for p in HERE.glob(g)})


def manifest_text() -> str:
    return "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(HERE).as_posix()}\n"
                   for p in _manifest_paths())


def check() -> list[str]:
    """Problems found: files that differ from the manifest, files it misses, traces the specs no
    longer render to. Empty when the set is intact."""
    problems = []
    if not MANIFEST.is_file():
        return ["MANIFEST.sha256 is missing"]
    listed = {}
    for line in MANIFEST.read_text().splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    present = {p.relative_to(HERE).as_posix(): p for p in _manifest_paths()}
    for name in sorted(set(listed) | set(present)):
        if name not in present:
            problems.append(f"{name}: listed in the manifest but missing")
        elif name not in listed:
            problems.append(f"{name}: not in the manifest")
        elif hashlib.sha256(present[name].read_bytes()).hexdigest() != listed[name]:
            problems.append(f"{name}: SHA-256 differs from the manifest")
    for path, text in rendered_files(load_specs()).items():
        if not path.is_file() or path.read_text() != text:
            problems.append(f"{path.relative_to(HERE).as_posix()}: the specs render something else")
    return problems


def build() -> int:
    specs = load_specs()
    TRACES.mkdir(exist_ok=True)
    files = rendered_files(specs)
    for stale in set(TRACES.glob("*.json")) - set(files):
        stale.unlink()
    for path, text in files.items():
        path.write_text(text)
    MANIFEST.write_text(manifest_text())
    return len(specs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="verify MANIFEST.sha256 and that the specs re-render the traces")
    args = ap.parse_args(argv)
    if args.check:
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        print("field set intact" if not problems else f"{len(problems)} problem(s)")
        return 1 if problems else 0
    print(f"rendered {build()} traces; wrote labels.json and MANIFEST.sha256")
    return 0


if __name__ == "__main__":
    sys.exit(main())
