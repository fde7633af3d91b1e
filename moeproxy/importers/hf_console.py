"""The console output of a Hugging Face ``Trainer`` (TRL's ``GRPOTrainer`` and the trainers built on
it): one Python dict per logging step.

transformers' ``ProgressCallback.on_log`` (``transformers/trainer_callback.py``) writes each logging
step with ``self.training_bar.write(str(shallow_logs))``: the ``repr`` of a dict on a line of its own
between the progress bar's redraws, ``total_flos`` removed and, in releases since 2024, every float
formatted as a string of four significant digits (``{'loss': '0.0123', 'grad_norm': '1.5', ...,
'epoch': 0.01}``); earlier releases print the floats themselves, and ``PrinterCallback`` prints the
same dict without a bar. Evaluation dicts (``eval_*`` keys only) and the closing summary
(``train_runtime``) are not training steps and are skipped.

The dict holds no step, and the progress bar cannot give it: a log written through ``nohup`` or a
pipe buffers the dicts (standard output) apart from the bar (standard error), so the bar drawn
before a dict may be hundreds of steps off. A dict's step is therefore its place among the training
dicts (1, 2, 3, …; a dict that carries its own ``step`` keeps it): one logged step per logging
interval, whatever ``logging_steps`` was. A dict that a terminal wrapped over several lines is read
whole.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moeproxy.importers.base import Records, as_step, read_text

# A dict repr whose first key is a quoted name; no nested braces (the logs dict is flat). Bounded so
# that a stray brace in other output cannot make one match swallow the file.
_DICT = re.compile(r"\{'[^{}]{1,20000}?\}")
#: Keys of a training step's dict: at least one of them must be there (a config dict printed at
#: start-up, or a generation's sampling parameters, has none).
TRAINING_KEYS = frozenset({"loss", "grad_norm", "learning_rate", "reward", "kl"})
SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second"})


def _literal(text: str) -> dict[str, Any] | None:
    """The dict a match holds, or None when it is not a dict literal (a brace in other output)."""
    try:
        value = ast.literal_eval(text.replace("\n", "").replace("\r", ""))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return None
    return value


def _number(value: Any) -> float | None:
    """A logged value as a float: numbers, and the strings of numbers newer releases print
    (``'0.0123'``, ``'nan'``, ``'inf'``); None for anything else (a too-long string's notice)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _is_training_step(d: Mapping[str, Any]) -> bool:
    return bool(TRAINING_KEYS & d.keys()) and not SUMMARY_KEYS & d.keys()


def detect(path: Path, head: str | None) -> bool:
    if head is None:
        return False
    return any((d := _literal(m.group(0))) is not None and _is_training_step(d)
               for m in _DICT.finditer(head))


def read(path: Path) -> Records:
    text = read_text(path)
    position = line = offset = 0
    for match in _DICT.finditer(text):
        line += text.count("\n", offset, match.start())
        offset = match.start()
        d = _literal(match.group(0))
        if d is None or not _is_training_step(d):
            continue
        position += 1
        values = {k: x for k, v in d.items() if k != "step" and (x := _number(v)) is not None}
        if values:
            yield (as_step(d["step"], f"{path}: line {line + 1}") if "step" in d else position), values
