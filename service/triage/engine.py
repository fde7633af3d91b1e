"""The bridge to the signature engine: stored metrics in, the SPEC section 5 triage object out.

Besides the ranking it computes what the triage page plots and cannot recompute cheaply at page
time: the detected change points, and for the top classes the matched fingerprint's expected
shape mapped back into the run's own units (its effect trace is in baseline units around the
class onset: ``level + trace * scale``, as :meth:`RunSignature.effect_trace` defines them).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from moeproxy.service.triage.errors import LibraryUnavailable
from moeproxy.service.triage.schemas import TriageCandidate, TriageResponse, TriageSiblingNote
from moeproxy.signatures.canonical import BinnedRun
from moeproxy.signatures.settings import DEFAULT_SETTINGS, RunSettings
from moeproxy.signatures.vocabulary import MetricAlias

log = logging.getLogger(__name__)

OVERLAY_CLASSES = 3  # expected shapes for the top three classes
DETAIL_CLASSES = 5  # per-metric match details for the top five


class SignatureEngine:
    """Loads the fingerprint library once (lazily, thread-safe) and evaluates runs with it."""

    def __init__(self, library_path: str | Path | None = None):
        self.library_path = library_path
        self._library = None
        self._layered: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def library(self):
        if self._library is None:
            with self._lock:
                if self._library is None:
                    from moeproxy.signatures.api import SignatureError, load_library

                    try:
                        self._library = load_library(self.library_path)
                    except (SignatureError, OSError) as exc:  # retried on the next evaluation
                        raise LibraryUnavailable(str(exc)) from exc
        return self._library

    def library_for(self, layer_path: str | None):
        """The base library, or the base with a model's layer over it (``FingerprintLibrary.layered``).
        Layers are written once and never changed, so each is read once and kept by path."""
        base = self.library
        if layer_path is None:
            return base
        with self._lock:
            cached = self._layered.get(layer_path)
        if cached is None:
            from moeproxy.signatures.api import SignatureError, load_library

            try:
                cached = base.layered(load_library(layer_path))
            except (SignatureError, OSError) as exc:
                raise LibraryUnavailable(f"library layer {layer_path}: {exc}") from exc
            with self._lock:
                self._layered[layer_path] = cached
        return cached

    def add_layer(self, layer_path: str, layer) -> None:
        """Keep a layer this process has just written (its library in memory) under its path, so
        the next evaluation with it does not read it back."""
        combined = self.library.layered(layer)
        with self._lock:
            self._layered[layer_path] = combined

    def warm(self) -> None:
        """Load the library and compile DTW (the first call compiles for seconds, SPEC section 8)."""
        from moeproxy.signatures.api import warm

        _ = self.library
        warm()

    def evaluate(
        self,
        run: BinnedRun,
        *,
        run_id: int,
        framework: str | None,
        aliases: Sequence[MetricAlias],
        now: datetime,
        layer_path: str | None = None,
        settings: RunSettings | None = None,
    ) -> TriageResponse:
        """``run`` as :func:`moeproxy.service.metrics.repository.read_binned` reads it; ``settings``
        what the run's config says (a LoRA policy)."""
        from moeproxy.signatures.api import canonicalise, expected_traces, run_signature, triage

        library = self.library_for(layer_path)
        canonical = canonicalise(run, aliases=aliases, framework=framework, settings=settings or DEFAULT_SETTINGS)
        sig = run_signature(canonical, library.params)
        result = triage(sig, library, run_id=run_id, now=now)
        candidates = [TriageCandidate(**c.to_dict()) for c in result.candidates]
        details: dict[str, Any] = {
            "change_points": {k: int(v) for k, v in result.change_points.items()},
            "strong_threshold": result.strong_threshold,
            "renamed": dict(sig.run.renamed),
            # What the run's config made triage assume (a LoRA policy's LR range, the KL coefficient
            # and the learning rate it states), and the whole-run findings with their sources, so a
            # reader sees why a rule did or did not fire.
            "settings": asdict(sig.run.settings),
            "findings": [f.to_dict() for f in result.findings],
            "candidates": {
                c.fault_class: {
                    "fingerprint_id": c.fingerprint_id,
                    "onset_step": c.onset_step,
                    "metrics": [m.to_dict() for m in c.matches],
                }
                for c in result.candidates[:DETAIL_CLASSES]
            },
            "overlays": {
                c.fault_class: overlay
                for c in result.candidates[:OVERLAY_CLASSES]
                if (overlay := expected_traces(sig, library.get(c.fingerprint_id)))
            },
        }
        return TriageResponse(
            run_id=run_id,
            evaluated_at=result.evaluated_at,
            candidates=candidates,
            verdict=result.verdict,
            siblings=[TriageSiblingNote(**n.to_dict()) for n in result.siblings],
            last_step=run.last_step,
            details=_json_safe(details),
        )


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    return value
