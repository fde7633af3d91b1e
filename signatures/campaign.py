"""Fingerprint campaigns as data: fault classes × parameter sets × seeds (pure; no engine import).

A campaign file is JSON::

    {"steps": 40, "seeds": [0, 1, 2], "heldout_seeds": [100, 101],
     "jobs": [{"fault_class": "stale_weight_sync", "params": {"variant": "skip_from_onset", "onset": 10}}, ...]}

Each job becomes one ``moeproxy reproduce`` run (the fault and its healthy twin for every seed); the
library seeds build the fingerprints, the held-out seeds calibrate the strong/weak threshold. The
parameter names are the reproduction engine's injector parameters (docs of ``moeproxy reproduce``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from moeproxy.reproduction.catalogue import FAULT_CLASSES, variant_kind
from moeproxy.signatures.errors import SignatureError


class CampaignError(SignatureError):
    """A campaign file that cannot be run."""


@dataclass(frozen=True)
class CampaignJob:
    fault_class: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        tail = "_".join(f"{k}-{v}" for k, v in sorted(self.params.items())) or "default"
        return re.sub(r"[^A-Za-z0-9_.=-]+", "-", f"{self.fault_class}__{tail}")


@dataclass(frozen=True)
class Campaign:
    jobs_: tuple[CampaignJob, ...]
    steps: int = 40
    seeds: tuple[int, ...] = (0, 1, 2)
    heldout_seeds: tuple[int, ...] = (100, 101)

    def __post_init__(self) -> None:
        for j in self.jobs_:
            if j.fault_class not in FAULT_CLASSES:
                raise CampaignError(f"unknown fault class {j.fault_class!r} (SPEC section 3)")
        if self.steps < 8:
            raise CampaignError("a campaign needs at least 8 steps per run")
        if not self.seeds:
            raise CampaignError("a campaign needs at least one library seed")
        if set(self.seeds) & set(self.heldout_seeds):
            raise CampaignError("held-out seeds must differ from the library seeds")

    def jobs(self) -> tuple[CampaignJob, ...]:
        return self.jobs_

    def override(self, *, classes: Sequence[str] | None = None, steps: int | None = None,
                 seeds: Sequence[int] | None = None, heldout_seeds: Sequence[int] | None = None) -> Campaign:
        jobs = self.jobs_ if classes is None else tuple(j for j in self.jobs_ if j.fault_class in classes)
        if classes is not None:
            unknown = set(classes) - set(FAULT_CLASSES)
            if unknown:
                raise CampaignError(f"unknown fault classes: {', '.join(sorted(unknown))}")
        return replace(self, jobs_=jobs, steps=steps or self.steps,
                       seeds=tuple(seeds) if seeds is not None else self.seeds,
                       heldout_seeds=tuple(heldout_seeds) if heldout_seeds is not None else self.heldout_seeds)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "seeds": list(self.seeds), "heldout_seeds": list(self.heldout_seeds),
                "jobs": [{"fault_class": j.fault_class, "params": dict(j.params)} for j in self.jobs_]}


def load_campaign(path: str | Path) -> Campaign:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CampaignError(f"{path}: cannot read campaign ({exc})") from None
    return campaign_from_dict(doc)


def campaign_from_dict(doc: Any) -> Campaign:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("jobs"), list):
        raise CampaignError("a campaign is an object with a 'jobs' list")
    jobs = []
    for i, j in enumerate(doc["jobs"]):
        if not isinstance(j, Mapping) or not isinstance(j.get("fault_class"), str):
            raise CampaignError(f"jobs[{i}]: needs 'fault_class'")
        jobs.append(CampaignJob(j["fault_class"], dict(j.get("params") or {})))
    kwargs = {k: doc[k] for k in ("steps",) if k in doc}
    for k in ("seeds", "heldout_seeds"):
        if k in doc:
            kwargs[k] = tuple(int(s) for s in doc[k])
    return Campaign(tuple(jobs), **kwargs)


#: Parameter sets of the default campaign: each class in its catalogue variants, code bugs at two
#: onsets, configuration faults from step 0 (the only onset they can have).
DEFAULT_ONSETS = (8, 14)


def default_campaign() -> Campaign:
    jobs = [CampaignJob("healthy")]
    for name, fc in FAULT_CLASSES.items():
        if name == "healthy":
            continue
        for variant in fc.variants:
            onsets = (0,) if variant_kind(name, variant) == "configuration" else DEFAULT_ONSETS
            for onset in onsets:
                jobs.append(CampaignJob(name, {"variant": variant, "onset": onset}))
    return Campaign(tuple(jobs))
