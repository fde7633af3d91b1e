"""Non-finite metric values, read and written the same way on every path.

A NaN ``grad_norm`` or an infinite log-prob difference is evidence, so every reader takes the
spellings that loggers write and every writer gives SPEC section 5's three. One table serves the
REST ingest codec, the MLflow routes, the files ``moeproxy triage`` reads (through
``signatures.canonical``), and the ingest body's JSON schema; the client (``moeproxy.client``, which
speaks HTTP only) keeps a copy that a test holds equal to this one.

Accepted, in any letter case: ``NaN``; ``Infinity``, ``+Infinity``, ``inf``, ``+inf``;
``-Infinity``, ``-inf``. Written: ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
"""

from __future__ import annotations

import math

#: Lower-cased spelling -> value.
NONFINITE_SPELLINGS: dict[str, float] = {
    "nan": math.nan,
    "infinity": math.inf,
    "+infinity": math.inf,
    "inf": math.inf,
    "+inf": math.inf,
    "-infinity": -math.inf,
    "-inf": -math.inf,
}

#: The same set as a JSON-schema pattern (ECMA-262 has no case-insensitive flag inside a pattern).
NONFINITE_PATTERN = r"^([nN][aA][nN]|[+-]?[iI][nN][fF]([iI][nN][iI][tT][yY])?)$"

#: What a writer emits (SPEC section 5).
NAN, POS_INF, NEG_INF = "NaN", "Infinity", "-Infinity"


def parse_nonfinite(text: str) -> float | None:
    """The value a non-finite spelling stands for, or None when ``text`` is not one."""
    if len(text) > 9:  # "+infinity" is the longest: skip lower() on long strings
        return None
    return NONFINITE_SPELLINGS.get(text.lower())


def format_value(value: float) -> float | str:
    """A value as JSON carries it: finite as a number, non-finite as SPEC section 5's strings."""
    if math.isnan(value):
        return NAN
    if math.isinf(value):
        return POS_INF if value > 0 else NEG_INF
    return value
