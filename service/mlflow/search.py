"""``runs/search``: the part of MLflow's search grammar a notebook uses to find its runs.

MLflow's filter is a conjunction of comparisons (``tags.phase = 'rl' and attributes.status =
'FINISHED'``). Supported here: ``attributes.`` (also ``attribute.``, ``attr.``, ``run.`` or none)
``run_name``, ``status``, ``run_id``, ``user_id``; ``tags.<key>`` and ``params.<key>`` (a key in
backticks or quotes when it holds dots or spaces); the operators ``=``, ``!=``, ``LIKE`` and
``ILIKE`` (``%`` and ``_`` wildcards). Anything else — metrics comparisons, ``IN``, ``OR`` — is
refused with ``INVALID_PARAMETER_VALUE`` naming what is not supported, never silently ignored.
Ordering: ``start_time``, ``end_time``, ``run_name``, ``status`` with ``ASC``/``DESC`` (MLflow's
default: start time, newest first).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from moeproxy.service.mlflow.errors import invalid
from moeproxy.service.mlflow.models import MlflowRun

ATTRIBUTES: dict[str, Callable[[MlflowRun], str | None]] = {
    "run_name": lambda r: r.run_name,
    "status": lambda r: r.status,
    "run_id": lambda r: r.run_uuid,
    "user_id": lambda r: r.user_id,
}
ORDERABLE: dict[str, Callable[[MlflowRun], object]] = {
    "start_time": lambda r: r.start_time or 0,
    "end_time": lambda r: r.end_time or 0,
    "run_name": lambda r: r.run_name,
    "status": lambda r: r.status,
}
_ATTRIBUTE_PREFIXES = ("attributes", "attribute", "attr", "run")

_CLAUSE = re.compile(
    r"""\s*(?:(?P<entity>[A-Za-z_]+)\.)?(?P<key>`[^`]+`|"[^"]+"|[A-Za-z0-9_.\-/]+)\s*
        (?P<op>!=|<=|>=|=|<|>|\bI?LIKE\b)\s*
        (?P<value>'(?:[^']|'')*'|"(?:[^"]|"")*"|[-+0-9.eE]+)\s*$""",
    re.IGNORECASE | re.VERBOSE,
)
_AND = re.compile(r"\s+and\s+", re.IGNORECASE)


@dataclass(frozen=True)
class Clause:
    entity: str  # attributes | tags | params
    key: str
    op: str  # = | != | like | ilike
    value: str

    def matches(self, run: MlflowRun) -> bool:
        if self.entity == "attributes":
            got = ATTRIBUTES[self.key](run)
        else:
            got = (run.tags if self.entity == "tags" else run.params or {}).get(self.key)
        if got is None:
            return False  # MLflow: a run without the tag or param matches no comparison on it
        if self.op == "=":
            return got == self.value
        if self.op == "!=":
            return got != self.value
        flags = re.IGNORECASE if self.op == "ilike" else 0
        pattern = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in self.value)
        return re.fullmatch(pattern, got, flags | re.DOTALL) is not None


def parse_filter(text: str | None) -> list[Clause]:
    if not text or not text.strip():
        return []
    clauses = []
    for part in _split_and(text):
        m = _CLAUSE.match(part)
        if m is None:
            raise invalid(f"filter {part.strip()!r}: not supported here (comparisons of attributes, tags and "
                          "params with =, !=, LIKE, ILIKE, joined by AND)")
        entity = (m.group("entity") or "attributes").lower()
        key = m.group("key").strip("`\"")
        op, raw = m.group("op").lower(), m.group("value")
        if entity in ("metric", "metrics", "dataset", "datasets"):
            raise invalid(f"filter on {entity}.{key}: not supported here (metrics are not searchable; "
                          "filter on attributes, tags or params)")
        if op not in ("=", "!=", "like", "ilike") or raw[0] not in "'\"":
            raise invalid(f"filter {part.strip()!r}: {m.group('op')} on a number is not supported here "
                          "(attributes, tags and params compare as strings with =, !=, LIKE, ILIKE)")
        value = raw[1:-1].replace("''", "'").replace('""', '"')
        if entity in _ATTRIBUTE_PREFIXES:
            if key not in ATTRIBUTES:
                raise invalid(f"filter on attribute {key!r}: not supported here; known: {', '.join(ATTRIBUTES)}")
            entity = "attributes"
        elif entity in ("tag", "tags"):
            entity = "tags"
        elif entity in ("param", "params", "parameter", "parameters"):
            entity = "params"
        else:
            raise invalid(f"filter on {entity}.{key}: not supported here (filter on attributes, tags or params)")
        clauses.append(Clause(entity, key, op, value))
    return clauses


def _split_and(text: str) -> list[str]:
    """Split on AND outside quotes and backticks."""
    parts: list[str] = []
    current: list[str] = []
    quote = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote is None and (m := _AND.match(text, i)):
            parts.append("".join(current))
            current, i = [], m.end()
            continue
        if quote is None and c in "'\"`":
            quote = c
        elif c == quote:
            quote = None
        current.append(c)
        i += 1
    parts.append("".join(current))
    return parts


def parse_order_by(items: Sequence[str]) -> list[tuple[str, bool]]:
    """[(attribute, descending)]; the default is the newest start time first."""
    out = []
    for item in items:
        words = item.strip().split()
        if not words or len(words) > 2 or (len(words) == 2 and words[1].upper() not in ("ASC", "DESC")):
            raise invalid(f"order_by {item!r}: expected '<attribute> [ASC|DESC]'")
        name = words[0].split(".", 1)[1] if "." in words[0] and words[0].split(".", 1)[0] in _ATTRIBUTE_PREFIXES \
            else words[0]
        if name not in ORDERABLE:
            raise invalid(f"order_by {item!r}: not supported here; order by {', '.join(ORDERABLE)}")
        out.append((name, len(words) == 2 and words[1].upper() == "DESC"))
    return out or [("start_time", True)]


def search(runs: Sequence[MlflowRun], filter_string: str | None, order_by: Sequence[str]) -> list[MlflowRun]:
    clauses = parse_filter(filter_string)
    order = parse_order_by(order_by)
    hits = [r for r in runs if all(c.matches(r) for c in clauses)]
    for name, descending in reversed(order):  # stable sorts, last key first
        hits.sort(key=ORDERABLE[name], reverse=descending)
    return hits
