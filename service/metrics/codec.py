"""Parsing of ingest bodies and encoding of metric values (SPEC section 5).

The ingest body is parsed by hand rather than through per-point pydantic
models: a batch of 100 steps x 20 metrics is 2,000 points, and this loop keeps
validation to a few hundred nanoseconds a point while giving the same kind of
error (a JSON ``detail`` that names the offending place).  The published
OpenAPI schema (``INGEST_BODY_SCHEMA``) documents exactly what is accepted.

Non-finite values are data.  The stdlib JSON parser accepts the ``NaN``,
``Infinity`` and ``-Infinity`` literals that Python, JavaScript and many
loggers emit; as strings (strict JSON has no other way to say them) every
spelling of :mod:`moeproxy.signatures.values` is accepted (``"NaN"``,
``"Infinity"``, ``"-Infinity"``, ``"inf"``, ``"+inf"``, ... in any case), and
responses use SPEC section 5's three.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

from moeproxy.service.errors import InvalidInput, PayloadTooLarge
from moeproxy.service.limits import INT64_MAX, text_problem
from moeproxy.signatures.values import NAN, NONFINITE_PATTERN, format_value, parse_nonfinite

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is a base dependency; the stdlib path still works
    orjson = None

MAX_STEPS_PER_REQUEST = 10_000
MAX_POINTS_PER_REQUEST = 1_000_000
# 1,000,000 points of ~50 bytes ("training/rollout_probs_diff_mean": 0.0123456789,) fit.
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_NAME_LENGTH = 512
MAX_STEP = INT64_MAX

INGEST_BODY_SCHEMA: dict = {
    "type": "object",
    "required": ["steps"],
    "additionalProperties": False,
    "properties": {
        "steps": {
            "type": "array",
            "maxItems": MAX_STEPS_PER_REQUEST,
            "items": {
                "type": "object",
                "required": ["step", "values"],
                "additionalProperties": False,
                "properties": {
                    "step": {"type": "integer", "minimum": 0, "maximum": MAX_STEP},
                    "values": {
                        "type": "object",
                        "propertyNames": {"minLength": 1, "maxLength": MAX_NAME_LENGTH},
                        "additionalProperties": {
                            "anyOf": [
                                {"type": "number"},
                                {"type": "string", "pattern": NONFINITE_PATTERN},
                            ]
                        },
                    },
                },
            },
        }
    },
    "example": {"steps": [{"step": 0, "values": {"actor/ppo_kl": 0.001, "actor/grad_norm": "NaN"}}]},
}


@dataclass(frozen=True, slots=True)
class ParsedBatch:
    """Validated points: ``by_step`` maps step -> {name: value} (duplicated steps merged, last wins)."""

    by_step: dict[int, dict[str, float]]
    names: tuple[str, ...]
    points: int

    @property
    def first_step(self) -> int:
        return min(self.by_step)

    @property
    def last_step(self) -> int:
        return max(self.by_step)


def _fail(where: str, problem: str) -> InvalidInput:
    return InvalidInput(f"{where}: {problem}")


def _check_name(name: str, where: str) -> None:
    if not name or not name.strip():
        raise _fail(where, "metric names must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise _fail(where, f"metric name longer than {MAX_NAME_LENGTH} characters")
    if (problem := text_problem(name)) is not None:  # refused here rather than with a 500 in the INSERT
        raise _fail(where, f"metric name {name[:40]!r} {problem}")


def _coerce(value: object, where: str) -> float:
    kind = type(value)
    if kind is float:
        return value  # type: ignore[return-value]
    if kind is int:
        try:
            return float(value)  # type: ignore[arg-type]
        except OverflowError:
            raise _fail(where, "integer too large for a float") from None
    if kind is str:
        parsed = parse_nonfinite(value)  # type: ignore[arg-type]
        if parsed is not None:
            return parsed
        raise _fail(where, f"expected a number or 'NaN'/'Infinity'/'-Infinity', got the string {value!r:.40}")
    raise _fail(where, f"expected a number, got {_json_type(value)}")


def _json_type(value: object) -> str:
    return {bool: "a boolean", type(None): "null", list: "an array", dict: "an object"}.get(type(value), "a string")


def decode_json(raw: bytes) -> object:
    """orjson first (about 3x faster on ingest bodies); it is strict JSON, so the NaN/Infinity
    literals and out-of-range numbers such as 1e400 fall back to the stdlib parser, which reads
    them as nan/inf and also words the error message for bodies that are not JSON at all."""
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(raw)
    except RecursionError:
        raise InvalidInput("body is nested too deeply to be an ingest body") from None
    except UnicodeDecodeError:
        raise InvalidInput("body is not UTF-8 JSON") from None
    except ValueError as exc:
        raise InvalidInput(f"body is not valid JSON: {exc}") from None


def parse_ingest_body(raw: bytes) -> ParsedBatch:
    """Validate an ingest body completely (nothing is written unless all of it is valid)."""
    doc = decode_json(raw)
    if type(doc) is not dict or "steps" not in doc:
        raise InvalidInput('body must be a JSON object {"steps": [{"step": int, "values": {name: number}}, ...]}')
    unknown = set(doc) - {"steps"}
    if unknown:
        raise InvalidInput(f"unknown field(s) in body: {', '.join(sorted(map(str, unknown)))}")
    steps = doc["steps"]
    if type(steps) is not list:
        raise InvalidInput("steps: expected an array")
    max_steps, max_points = MAX_STEPS_PER_REQUEST, MAX_POINTS_PER_REQUEST
    if len(steps) > max_steps:
        raise PayloadTooLarge(f"{len(steps):,} steps in one request; the limit is {max_steps:,}: split the batch")
    by_step: dict[int, dict[str, float]] = {}
    names: dict[str, None] = {}
    sent = 0
    for i, entry in enumerate(steps):
        step, values = _parse_entry(entry, i)
        sent += len(values)
        if sent > max_points:
            raise PayloadTooLarge(f"more than {max_points:,} points in one request; the limit is {max_points:,}: split the batch")
        # Hot loop (SPEC 5 batches are thousands of points): floats, the usual case, are
        # accepted in place; anything else goes through _coerce, which converts or rejects.
        for name, value in values.items():
            if name not in names:
                _check_name(name, f"steps[{i}].values")
                names[name] = None
            if type(value) is not float:
                values[name] = _coerce(value, f"steps[{i}].values[{name!r}]")
        previous = by_step.get(step)
        if previous is None:
            by_step[step] = values
        else:  # the same step twice in one request: merge, the later value wins
            previous.update(values)
    points = sum(map(len, by_step.values()))
    return ParsedBatch(by_step=by_step, names=tuple(names), points=points)


def _parse_entry(entry: object, i: int) -> tuple[int, dict]:
    where = f"steps[{i}]"
    if type(entry) is not dict:
        raise _fail(where, 'expected an object {"step": int, "values": {...}}')
    if len(entry) != 2 or "step" not in entry or "values" not in entry:
        missing = {"step", "values"} - set(entry)
        if missing:
            raise _fail(where, f"missing field(s): {', '.join(sorted(missing))}")
        raise _fail(where, f"unknown field(s): {', '.join(sorted(set(entry) - {'step', 'values'}))}")
    step = entry["step"]
    if type(step) is not int:
        raise _fail(f"{where}.step", f"expected a non-negative integer, got {_json_type(step) if not isinstance(step, float) else repr(step)}")
    if step < 0:
        raise _fail(f"{where}.step", f"must be >= 0, got {step}")
    if step > MAX_STEP:
        raise _fail(f"{where}.step", "too large (must fit in 64 bits)")
    values = entry["values"]
    if type(values) is not dict:
        raise _fail(f"{where}.values", "expected an object {name: number}")
    return step, values


def dumps(content: object) -> bytes:
    """Strict JSON bytes (callers have already turned non-finite floats into strings)."""
    if orjson is not None:
        return orjson.dumps(content)
    return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


def encode_value(value: float | None) -> float | str:
    """A stored value as JSON: NULL (stored NaN) and non-finite floats become strings."""
    return NAN if value is None else format_value(value)


def encode_values(values: Iterable[float | None]) -> list[float | str]:
    isfinite = math.isfinite
    return [v if v is not None and isfinite(v) else encode_value(v) for v in values]

