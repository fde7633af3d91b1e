"""The fingerprint model and the library file format (docs/fingerprints.md).

A :class:`Fingerprint` describes one fault class (one variant and parameter set) the way a run
alone shows it — so a production run without a healthy twin can be compared with it:

- per canonical metric: its role (``affected`` by the fault or ``unaffected``), the expected
  direction of change against the pre-onset baseline, the post-onset trend, the onset lag relative
  to the class onset (earliest onset among the affected metrics), the level-shift ratio, how often
  the metric went non-finite, and representative effect traces (baseline units, aligned on the
  class onset) from several proxy runs;
- provenance: model, proxy report, fault parameters, seeds, the runs it was built from.

A :class:`FingerprintLibrary` is a list of fingerprints plus the signature parameters they were
built with and the calibrated ``strong`` threshold. ``load_library`` validates every field and
raises :class:`InvalidLibrary` naming the path of the first bad one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from moeproxy.reproduction.catalogue import FAMILIES, FAULT_CLASSES
from moeproxy.signatures.errors import InvalidLibrary, UnknownFaultClass
from moeproxy.signatures.features import SignatureParams
from moeproxy.signatures.vocabulary import CONTROL_METRICS, DEFAULT_ALIASES, alias_index, canonical_name

FORMAT_VERSION = 1
LIBRARY_FILE = "fingerprints.json"
MANIFEST_FILE = "manifest.json"
ROLES = ("affected", "unaffected")
DEFAULT_STRONG_THRESHOLD = 0.6
#: A log10 spread change below this is no change (build: the 5x volatility test).
FLAT_VOLATILITY = 0.7
#: Below this separation (fault runs' median score minus their twins') a fingerprint is not ranked.
MIN_SEPARATION = 0.1


@dataclass(frozen=True)
class MetricExpectation:
    source: str  # the name the proxy runs logged it under (verl names)
    role: str
    direction: int  # +1 / -1 / 0 against the pre-onset baseline
    agreement: float  # share of the runs that showed that direction
    trend: int  # post-onset trend sign
    onset_lag: float | None  # grid points after the class onset; None: no own onset
    onset_lag_spread: float
    log10_ratio: float | None  # median log10(post/pre) level ratio
    effect_z: float  # median shift in baseline-noise units
    nonfinite_rate: float  # share of runs where it went NaN/inf
    traces: tuple[tuple[float, ...], ...] = ()  # effect traces, trace_pre points before the onset
    log10_volatility: float | None = None  # median log10(post/pre spread) around the fault onset
    freeze_rate: float = 0.0  # share of runs where it stopped moving (ppo_kl exactly 0 once updates stop)
    drift: int = 0  # sign of a significant trend, however small, that every run shows (a slow healthy rise)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        if any(v not in (-1, 0, 1) for v in (self.direction, self.trend, self.drift)):
            raise ValueError("direction, trend and drift must be -1, 0 or 1")

    @property
    def affected(self) -> bool:
        return self.role == "affected"

    @property
    def flat(self) -> bool:
        """The fingerprint's runs show no change in this metric at all: no direction, no trend or
        drift, no freeze, no non-finite value, its spread unchanged. An affected metric can be flat (the fault
        took away the rise its twins show); its effect trace is then noise, whose shape and change
        points mean nothing."""
        return (self.direction == 0 and self.trend == 0 and self.drift == 0 and self.freeze_rate < 0.5
                and self.nonfinite_rate < 0.5
                and (self.log10_volatility is None or abs(self.log10_volatility) < FLAT_VOLATILITY))

    def mean_trace(self) -> np.ndarray | None:
        """The expected shape (mean of the representative traces, truncated to the shortest)."""
        if not self.traces:
            return None
        n = min(len(t) for t in self.traces)
        return np.mean([np.asarray(t[:n]) for t in self.traces], axis=0)


@dataclass(frozen=True)
class Fingerprint:
    id: str
    fault_class: str
    family: str
    variant: str
    params: Mapping[str, Any]
    aligned: bool  # effect traces and onset lags are meaningful (False for healthy)
    trace_pre: int
    metrics: Mapping[str, MetricExpectation]
    provenance: Mapping[str, Any] = field(default_factory=dict)
    #: How much higher the matcher scores the fingerprint's own fault runs than their healthy twins
    #: (median minus median, build.separation); None: built without twins, or before it was measured.
    separation: float | None = None
    #: Every run it was built from had the fault from its first step: its traces start at the
    #: run's start, and so does its class onset in any run it is compared with.
    from_start: bool = False
    #: The best score any of its healthy twins got when it was built (build.separation's other
    #: half): a run that scores no higher looks no more like the fault than a run without it.
    #: None: built without twins, or before it was recorded.
    twin_score: float | None = None

    @property
    def affected_metrics(self) -> tuple[str, ...]:
        return tuple(m for m, e in self.metrics.items() if e.affected)

    @property
    def separable(self) -> bool:
        """The fingerprint tells its fault from a healthy run at all. A fault present from step 0
        that moves nothing a run shows by itself (a constant 10x in the rollout mismatch) gives
        a fingerprint its own healthy twins match as well as its fault runs: ranking with it would
        only call healthy runs faulty. Such a class is left to the whole-run findings (levels.py).

        Where the separation was not measured (a library built before it was), a fault fingerprint
        whose only evidence is settings and metrics that do not move is taken as not separable: it
        expects what any quiet healthy run shows (the 40-step KL sign flip of the first library
        matched a healthy run at 1.00)."""
        if self.fault_class == "healthy":
            return True if self.separation is None else self.separation >= MIN_SEPARATION
        if not any(e.affected for m, e in self.metrics.items() if m not in CONTROL_METRICS):
            # Nothing it expects differs from a quiet run: any run that logs little matches it
            # fully (score 1.0 with no evidence), whatever its twins scored when it was built.
            return False
        if self.separation is not None:
            return self.separation >= MIN_SEPARATION
        return not self.flat_only

    @property
    def flat_only(self) -> bool:
        """A fault fingerprint whose every affected metric is flat (``MetricExpectation.flat``): the
        fault only took away a drift its twins show (an update skipped from step 0, a constant
        reward). A lone run shows that only as "no drift", which a healthy run that learns slowly
        shows too, so such a fingerprint matches any quiet run at 1.00; the matcher counts it only
        beside a whole-run finding for its class (``matching.triage``)."""
        if self.fault_class == "healthy":
            return False
        return all(e.flat for m, e in self.metrics.items() if e.affected and m not in CONTROL_METRICS)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["params"] = dict(self.params)
        d["provenance"] = dict(self.provenance)
        d["metrics"] = {m: _expectation_to_dict(e) for m, e in self.metrics.items()}
        return d


def _expectation_to_dict(e: MetricExpectation) -> dict[str, Any]:
    d = asdict(e)
    d["traces"] = [[_round(v) for v in t] for t in e.traces]
    for k in ("onset_lag", "onset_lag_spread", "log10_ratio", "effect_z", "agreement", "nonfinite_rate",
              "log10_volatility", "freeze_rate"):
        if d[k] is not None:
            d[k] = _round(d[k])
    return d


def _round(v: float) -> float:
    return float(f"{v:.6g}")


@dataclass(frozen=True)
class ViewCalibration:
    """The threshold of one metric set (a framework's standard loggers, ``vocabulary.VIEWS``): the
    library's runs projected onto that set score lower than with every metric (fewer parts, less
    coverage), so a run that logs only TRL's names is judged against TRL's threshold."""

    strong_threshold: float
    metrics: tuple[str, ...]  # the canonical metrics of the view the library's runs showed
    balanced_accuracy: float = 0.0
    n_heldout: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.strong_threshold <= 1.0:
            raise ValueError("strong_threshold must lie in [0, 1]")


@dataclass(frozen=True)
class Calibration:
    strong_threshold: float = DEFAULT_STRONG_THRESHOLD
    method: str = "default (not calibrated)"
    n_heldout: int = 0
    views: Mapping[str, ViewCalibration] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.strong_threshold <= 1.0:
            raise ValueError("strong_threshold must lie in [0, 1]")

    def threshold_for(self, metrics: Collection[str]) -> tuple[str | None, float]:
        """(view, threshold) for a run logging the canonical ``metrics``: the calibrated view whose
        metric set is nearest (Jaccard) to what the run logs of the library's metrics, else the
        library-wide threshold (view None). Ties go to the higher threshold: the cautious one."""
        have = set(metrics)
        best: tuple[float, float, str] | None = None
        for name, view in self.views.items():
            want = set(view.metrics)
            union = have | want
            jaccard = len(have & want) / len(union) if union else 0.0
            key = (jaccard, view.strong_threshold, name)
            if best is None or key > best:
                best = key
        if best is None or best[0] == 0.0:
            return None, self.strong_threshold
        return best[2], self.views[best[2]].strong_threshold


@dataclass(frozen=True)
class FingerprintLibrary:
    fingerprints: tuple[Fingerprint, ...]
    params: SignatureParams = field(default_factory=SignatureParams)
    calibration: Calibration = field(default_factory=Calibration)
    generator: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @property
    def fault_classes(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for f in self.fingerprints:
            seen.setdefault(f.fault_class, None)
        return tuple(seen)

    def of_class(self, fault_class: str) -> tuple[Fingerprint, ...]:
        out = tuple(f for f in self.fingerprints if f.fault_class == fault_class)
        if not out:
            raise UnknownFaultClass(f"no fingerprint of class {fault_class!r} in the library")
        return out

    def get(self, fingerprint_id: str) -> Fingerprint:
        for f in self.fingerprints:
            if f.id == fingerprint_id:
                return f
        raise UnknownFaultClass(f"no fingerprint {fingerprint_id!r} in the library")

    def without_class(self, fault_class: str) -> FingerprintLibrary:
        """The library with one class left out (the leave-one-class-out benchmark)."""
        keep = tuple(f for f in self.fingerprints if f.fault_class != fault_class)
        return FingerprintLibrary(keep, self.params, self.calibration, self.generator, self.format_version)

    def with_calibration(self, calibration: Calibration) -> FingerprintLibrary:
        return FingerprintLibrary(self.fingerprints, self.params, calibration, self.generator,
                                  self.format_version)

    def layered(self, layer: FingerprintLibrary) -> FingerprintLibrary:
        """This library with ``layer`` over it: the layer's fingerprints added (one with an id this
        library holds replaces it) and the layer's calibration, which was made for the combination.
        A model-specific layer (the fingerprints a reproduction on that model's proxy made) is read
        this way over the shipped library; both must be built with the same signature parameters,
        or their fingerprints would describe different features."""
        if layer.params != self.params:
            raise InvalidLibrary("params", "a layer must be built with the signature parameters of the "
                                 "library under it")
        ids = {f.id for f in layer.fingerprints}
        kept = tuple(f for f in self.fingerprints if f.id not in ids)
        generator = {**dict(self.generator), "layer": dict(layer.generator)}
        return FingerprintLibrary(kept + layer.fingerprints, self.params, layer.calibration, generator,
                                  self.format_version)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "generator": dict(self.generator),
            "params": asdict(self.params),
            "calibration": asdict(self.calibration),
            "fingerprints": [f.to_dict() for f in self.fingerprints],
        }


# --------------------------------------------------------------------------------------------
# reading and writing


def resolve_library_path(path: str | Path | None = None) -> Path:
    """The library file: ``path`` (a file or a directory holding fingerprints.json), else the
    shipped library. The library reads no environment: the CLI and the service pass
    ``MOEPROXY_FINGERPRINTS`` (their Settings) in as ``path``."""
    if path is None:
        path = shipped_library_dir()
    p = Path(path)
    return p / LIBRARY_FILE if p.is_dir() else p


def shipped_library_dir() -> Path:
    return Path(__file__).resolve().parent / "library"


def load_library(path: str | Path | None = None) -> FingerprintLibrary:
    p = resolve_library_path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise InvalidLibrary(str(p), "no such file") from None
    except json.JSONDecodeError as exc:
        raise InvalidLibrary(str(p), f"not JSON ({exc.msg} at line {exc.lineno})") from None
    return library_from_dict(doc)


def save_library(library: FingerprintLibrary, path: str | Path, *,
                 manifest: Mapping[str, Any] | None = None) -> Path:
    """Write ``fingerprints.json`` (and ``manifest.json`` next to it when given) into a directory,
    or to the file ``path`` when it ends in ``.json``."""
    p = Path(path)
    target = p if p.suffix == ".json" else p / LIBRARY_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(library.to_dict(), indent=1, allow_nan=False) + "\n"
    library_from_dict(json.loads(text))  # never write a file the loader would refuse
    target.write_text(text)
    if manifest is not None:
        m = dict(manifest)
        m["library_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        m["fingerprints"] = len(library.fingerprints)
        m["classes"] = {c: len(library.of_class(c)) for c in library.fault_classes}
        (target.parent / MANIFEST_FILE).write_text(json.dumps(m, indent=1) + "\n")
    return target


def with_canonical_names(fp: Fingerprint) -> Fingerprint:
    """``fp`` with its metrics under today's canonical names.

    A fingerprint stores the names canonicalisation gave when it was built; a metric the
    vocabulary has named since (``response_length/max`` -> ``response_length_max``) is renamed
    here, so a library keeps matching runs as the vocabulary grows. The fingerprints come from
    the engine's verl names; a name whose canonical one is already taken stays as it is.
    """
    index = alias_index(DEFAULT_ALIASES, "verl")
    renamed: dict[str, MetricExpectation] = {}
    for name, exp in fp.metrics.items():
        canon = canonical_name(name, index)
        renamed[canon if canon not in fp.metrics and canon not in renamed else name] = exp
    if list(renamed) == list(fp.metrics):
        return fp
    return replace(fp, metrics=renamed)


def library_from_dict(doc: Any) -> FingerprintLibrary:
    v = _Validator()
    return v.library(doc)


class _Validator:
    """Turns the JSON document into the model, naming the path of the first bad field."""

    def library(self, doc: Any) -> FingerprintLibrary:
        self.obj(doc, "")
        version = self.get(doc, "format_version", "", int)
        if version != FORMAT_VERSION:
            raise InvalidLibrary("format_version", f"unsupported version {version} (this reads {FORMAT_VERSION})")
        generator = doc.get("generator", {})
        self.obj(generator, "generator")
        params = self.params(doc.get("params", {}), "params")
        calibration = self.calibration(doc.get("calibration", {}), "calibration")
        fps = self.get(doc, "fingerprints", "", list)
        out = tuple(with_canonical_names(self.fingerprint(f, f"fingerprints[{i}]")) for i, f in enumerate(fps))
        ids = [f.id for f in out]
        for i, fid in enumerate(ids):
            if ids.index(fid) != i:
                raise InvalidLibrary(f"fingerprints[{i}].id", f"duplicate id {fid!r}")
        return FingerprintLibrary(out, params, calibration, generator, version)

    def params(self, d: Any, path: str) -> SignatureParams:
        self.obj(d, path)
        known = {f.name: f.type for f in fields(SignatureParams)}
        kwargs = {}
        for k, val in d.items():
            if k not in known:
                raise InvalidLibrary(f"{path}.{k}", "unknown signature parameter")
            if isinstance(val, bool) or not isinstance(val, int | float):
                raise InvalidLibrary(f"{path}.{k}", "must be a number")
            kwargs[k] = val
        try:
            return SignatureParams(**kwargs)
        except (TypeError, ValueError) as exc:
            raise InvalidLibrary(path, str(exc)) from None

    def calibration(self, d: Any, path: str) -> Calibration:
        self.obj(d, path)
        thr = d.get("strong_threshold", DEFAULT_STRONG_THRESHOLD)
        self.number(thr, f"{path}.strong_threshold", lo=0.0, hi=1.0)
        method = d.get("method", Calibration.method)
        if not isinstance(method, str):
            raise InvalidLibrary(f"{path}.method", "must be a string")
        n = self.count(d.get("n_heldout", 0), f"{path}.n_heldout")
        views = d.get("views", {})
        self.obj(views, f"{path}.views")
        return Calibration(float(thr), method, n, {k: self.view(v, f"{path}.views.{k}") for k, v in views.items()})

    def view(self, d: Any, path: str) -> ViewCalibration:
        self.obj(d, path)
        thr = self.number(d.get("strong_threshold"), f"{path}.strong_threshold", lo=0.0, hi=1.0)
        metrics = self.get(d, "metrics", path, list)
        if not all(isinstance(m, str) for m in metrics):
            raise InvalidLibrary(f"{path}.metrics", "must be a list of metric names")
        acc = self.number(d.get("balanced_accuracy", 0.0), f"{path}.balanced_accuracy", lo=0.0, hi=1.0)
        return ViewCalibration(float(thr), tuple(metrics), float(acc), self.count(d.get("n_heldout", 0),
                                                                                  f"{path}.n_heldout"))

    @staticmethod
    def count(n: Any, path: str) -> int:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidLibrary(path, "must be an integer >= 0")
        return n

    def fingerprint(self, d: Any, path: str) -> Fingerprint:
        self.obj(d, path)
        fid = self.get(d, "id", path, str)
        fc = self.get(d, "fault_class", path, str)
        if fc not in FAULT_CLASSES:
            raise InvalidLibrary(f"{path}.fault_class", f"unknown fault class {fc!r} (SPEC section 3)")
        family = self.get(d, "family", path, str)
        if family not in FAMILIES:
            raise InvalidLibrary(f"{path}.family", f"unknown family {family!r}")
        if family != FAULT_CLASSES[fc].family:
            raise InvalidLibrary(f"{path}.family", f"{fc} belongs to {FAULT_CLASSES[fc].family!r}")
        variant = self.get(d, "variant", path, str)
        params = self.get(d, "params", path, dict)
        aligned = self.get(d, "aligned", path, bool)
        trace_pre = self.get(d, "trace_pre", path, int)
        if trace_pre < 0:
            raise InvalidLibrary(f"{path}.trace_pre", "must be >= 0")
        metrics_doc = self.get(d, "metrics", path, dict)
        if not metrics_doc:
            raise InvalidLibrary(f"{path}.metrics", "must name at least one metric")
        metrics = {m: self.expectation(e, f"{path}.metrics.{m}") for m, e in metrics_doc.items()}
        provenance = d.get("provenance", {})
        self.obj(provenance, f"{path}.provenance")
        separation = d.get("separation")
        if separation is not None:
            separation = self.number(separation, f"{path}.separation", lo=-1.0, hi=1.0)
        from_start = d.get("from_start", False)
        if not isinstance(from_start, bool):
            raise InvalidLibrary(f"{path}.from_start", "must be true or false")
        twin_score = d.get("twin_score")
        if twin_score is not None:
            twin_score = self.number(twin_score, f"{path}.twin_score", lo=0.0, hi=1.0)
        return Fingerprint(fid, fc, family, variant, params, aligned, trace_pre, metrics, provenance,
                           separation, from_start, twin_score)

    def expectation(self, d: Any, path: str) -> MetricExpectation:
        self.obj(d, path)
        source = self.get(d, "source", path, str)
        role = self.get(d, "role", path, str)
        if role not in ROLES:
            raise InvalidLibrary(f"{path}.role", f"must be one of {list(ROLES)}")
        direction = self.get(d, "direction", path, int)
        if direction not in (-1, 0, 1):
            raise InvalidLibrary(f"{path}.direction", "must be -1, 0 or 1")
        trend, drift = (d.get(key, 0) for key in ("trend", "drift"))
        for key, val in (("trend", trend), ("drift", drift)):
            if isinstance(val, bool) or val not in (-1, 0, 1):
                raise InvalidLibrary(f"{path}.{key}", "must be -1, 0 or 1")
        agreement = self.number(d.get("agreement", 1.0), f"{path}.agreement", lo=0.0, hi=1.0)
        lag = d.get("onset_lag")
        if lag is not None:
            lag = self.number(lag, f"{path}.onset_lag")
        spread = self.number(d.get("onset_lag_spread", 0.0), f"{path}.onset_lag_spread", lo=0.0)
        ratio = d.get("log10_ratio")
        if ratio is not None:
            ratio = self.number(ratio, f"{path}.log10_ratio")
        effect = self.number(d.get("effect_z", 0.0), f"{path}.effect_z")
        nfr = self.number(d.get("nonfinite_rate", 0.0), f"{path}.nonfinite_rate", lo=0.0, hi=1.0)
        traces_doc = d.get("traces", [])
        if not isinstance(traces_doc, list):
            raise InvalidLibrary(f"{path}.traces", "must be a list of lists of numbers")
        traces = []
        for i, t in enumerate(traces_doc):
            if not isinstance(t, list) or not t:
                raise InvalidLibrary(f"{path}.traces[{i}]", "must be a non-empty list of numbers")
            for j, v in enumerate(t):
                self.number(v, f"{path}.traces[{i}][{j}]")
            traces.append(tuple(float(v) for v in t))
        vol = d.get("log10_volatility")
        if vol is not None:
            vol = self.number(vol, f"{path}.log10_volatility", lo=-3.0, hi=3.0)
        freeze = self.number(d.get("freeze_rate", 0.0), f"{path}.freeze_rate", lo=0.0, hi=1.0)
        return MetricExpectation(source, role, direction, agreement, trend, lag, spread, ratio, effect,
                                 nfr, tuple(traces), vol, freeze, drift)

    # -- primitives

    @staticmethod
    def obj(d: Any, path: str) -> None:
        if not isinstance(d, dict):
            raise InvalidLibrary(path or "$", "must be a JSON object")

    @staticmethod
    def get(d: Mapping[str, Any], key: str, path: str, kind: type) -> Any:
        where = f"{path}.{key}" if path else key
        if key not in d:
            raise InvalidLibrary(where, "missing")
        val = d[key]
        ok = isinstance(val, kind) and not (kind is int and isinstance(val, bool))
        if not ok:
            raise InvalidLibrary(where, f"must be {_KIND_NAMES.get(kind, kind.__name__)}")
        return val

    @staticmethod
    def number(v: Any, path: str, *, lo: float | None = None, hi: float | None = None) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise InvalidLibrary(path, "must be a finite number")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise InvalidLibrary(path, f"must lie in [{lo}, {hi}]")
        return float(v)


_KIND_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "an object", list: "a list"}


def describe(fp: Fingerprint) -> dict[str, Any]:
    """A short summary for ``fingerprints list/show``."""
    return {
        "id": fp.id,
        "fault_class": fp.fault_class,
        "family": fp.family,
        "variant": fp.variant,
        "params": dict(fp.params),
        "affected": {m: e.direction for m, e in fp.metrics.items() if e.affected},
        "runs": len(fp.provenance.get("runs", [])) or fp.provenance.get("n_runs"),
        "source": fp.provenance.get("source"),
        "separation": fp.separation,
        "twin_score": fp.twin_score,
    }
