"""Which framework logged a run, from metric names that only one framework logs.

The names come from the alias table (``moeproxy.signatures.vocabulary``, plain data, no numpy):
a logged name that one framework lists and no other is evidence for it; names of two frameworks,
or none, say nothing (``None``). Only namespaced names (``critic/score/mean``,
``completions/mean_length``, ``train/kl``) count: bare ones (``loss``, ``kl``, ``reward``) are
what any training loop logs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from functools import lru_cache

from moeproxy.signatures.vocabulary import DEFAULT_ALIASES

# transformers' TensorBoard, W&B and MLflow callbacks log training values under ``train/``
# (``transformers.integrations.rewrite_logs``), so a TRL run read from those stores says
# ``train/completions/mean_length``.
TRANSFORMERS_PREFIX = "train/"


@lru_cache(maxsize=1)
def distinctive_names() -> dict[str, str]:
    """Logged name -> the one framework that logs it."""
    frameworks: dict[str, set[str]] = defaultdict(set)
    for alias in DEFAULT_ALIASES:
        if alias.framework != "*" and "/" in alias.name:
            frameworks[alias.name].add(alias.framework)
    return {name: next(iter(fws)) for name, fws in frameworks.items() if len(fws) == 1}


def detect_framework(names: Iterable[str]) -> str | None:
    """The framework whose distinctive names the run logs, or None when there are none or several."""
    table = distinctive_names()
    found = set()
    for name in names:
        for candidate in (name, name.removeprefix(TRANSFORMERS_PREFIX)):
            if candidate in table:
                found.add(table[candidate])
    return found.pop() if len(found) == 1 else None
