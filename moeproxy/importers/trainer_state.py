"""transformers' ``trainer_state.json`` (TRL's trainers save the same file): its ``log_history``.

Each entry of ``log_history`` is one ``Trainer.log`` call with its ``step`` (the global step); a
training entry and an evaluation entry may share a step. The end-of-training summary
(``train_runtime``, ``total_flos``, ...) is left out, as ``MoeproxyCallback`` leaves it out live.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from moeproxy.importers.base import InvalidSource, Records, as_step, read_text
from moeproxy.integrations._common import END_OF_TRAINING_KEYS

FILE_NAME = "trainer_state.json"


def detect(path: Path, head: str | None) -> bool:
    if path.name == FILE_NAME:
        return True
    return head is not None and head.lstrip().startswith("{") and '"log_history"' in head


def read(path: Path) -> Records:
    try:
        state = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise InvalidSource(f"{path}: line {exc.lineno}: not JSON ({exc.msg})") from None
    history = state.get("log_history") if isinstance(state, Mapping) else None
    if not isinstance(history, list):
        raise InvalidSource(f"{path}: expected a JSON object with a 'log_history' list")
    for i, entry in enumerate(history):
        where = f"{path}: log_history[{i}]"
        if not isinstance(entry, Mapping) or "step" not in entry:
            raise InvalidSource(f"{where}: expected an object with 'step'")
        step = as_step(entry["step"], where)
        yield step, {k: v for k, v in entry.items() if k != "step" and k not in END_OF_TRAINING_KEYS}
