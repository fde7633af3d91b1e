"""Response formats of the task suite: what a model is trained to write after a prompt, and how
a completion is scored, as reward components the way production RL writes them.

- ``answer`` (the fidelity references): the bare answer, then the end marker. One component,
  ``accuracy``.
- ``reasoning`` (the RL starting points): a char-level analogue of
  ``<think>…</think><answer>…</answer>``, here ``<t>`` scratchpad ``</t><a>`` answer ``</a>``, then
  the end marker. The scratchpad is a short worked solution of the task (see :data:`SCRATCHPADS`),
  so a response has a reasoning part whose length can drift under RL, and the answer sits in a
  fixed place that a parser looks for. Two components, as the R1-style recipes in TRL and verl
  write them: ``accuracy`` (the answer inside ``<a>…</a>`` is exactly right) and ``format`` (the
  whole response matches the template). The total reward is their sum (TRL adds its reward
  functions with weight 1 by default).

A checkpoint names its format in ``config.json`` (``task_format``; absent means ``answer``, the
format of every checkpoint made before formats existed), so proxies built from it keep it.

Pure Python: imports nothing heavy and no other stage.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from moeproxy.reproduction.errors import UnknownFormat
from moeproxy.reproduction.tasks import END_MARKER, Example, extract_answer

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<t>", "</t>", "<a>", "</a>"
#: ``config.json`` key that names a checkpoint's response format.
CONFIG_KEY = "task_format"
DEFAULT_FORMAT = "answer"


# --- scratchpads: a worked solution per task, computed from the prompt ---------------------------------

def _numbers(example: Example, op: str) -> tuple[int, int]:
    a, b = example.prompt[:-1].split(op)
    return int(a), int(b)


def _addition_pad(ex: Example) -> str:
    a, b = _numbers(ex, "+")
    tens, units = b // 10 * 10, b % 10
    return f"{a}+{tens}={a + tens},{a + tens}+{units}={a + b}"


def _subtraction_pad(ex: Example) -> str:
    a, b = _numbers(ex, "-")
    tens, units = b // 10 * 10, b % 10
    return f"{a}-{tens}={a - tens},{a - tens}-{units}={a - b}"


def _multiplication_pad(ex: Example) -> str:
    a, d = _numbers(ex, "*")
    parts = [int(c) * 10 ** i for i, c in enumerate(reversed(str(a))) if c != "0"][::-1] or [0]
    products = [p * d for p in parts]
    steps = [f"{p}*{d}={q}" for p, q in zip(parts, products)]
    if len(products) > 1:
        steps.append("+".join(map(str, products)) + f"={a * d}")
    return ",".join(steps)


def _reversal_pad(ex: Example) -> str:
    return ",".join(reversed(ex.prompt[len("rev:"):-1]))


def _sorting_pad(ex: Example) -> str:
    return ",".join(sorted(ex.prompt[len("sort:"):-1]))


def _counting_pad(ex: Example) -> str:
    head, s = ex.prompt[:-1].split(":")
    target, seen, marks = head.removeprefix("count "), 0, []
    for ch in s:
        seen += ch == target
        marks.append(str(seen) if ch == target else ".")
    return "".join(marks)


def _brackets_pad(ex: Example) -> str:
    """The stack depth after each character; ``x`` where a closer does not match (and stop)."""
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    out = []
    for ch in ex.prompt[len("bal:"):-1]:
        if ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                out.append("x")
                break
        else:
            stack.append(ch)
        out.append(str(len(stack)))
    return "".join(out)


#: Registry: task name -> its scratchpad (tested to cover every task of the suite).
SCRATCHPADS: dict[str, Callable[[Example], str]] = {
    "addition": _addition_pad,
    "subtraction": _subtraction_pad,
    "multiplication": _multiplication_pad,
    "reversal": _reversal_pad,
    "sorting": _sorting_pad,
    "counting": _counting_pad,
    "brackets": _brackets_pad,
}


# --- formats -------------------------------------------------------------------------------------------

def _strip(completion: str) -> str:
    """The response up to the end marker, padding removed."""
    return completion.split(END_MARKER, 1)[0].replace("<pad>", "")


_TEMPLATE = re.compile(r"<t>[^<>]*</t><a>([^<>]*)</a>")
_ANSWER = re.compile(r"<a>([^<>]*)</a>")


def _answer_components(example: Example, completion: str) -> dict[str, float]:
    return {"accuracy": 1.0 if extract_answer(completion) == example.answer else 0.0}


def _reasoning_components(example: Example, completion: str) -> dict[str, float]:
    text = _strip(completion).strip()
    found = _ANSWER.search(text)
    return {
        "accuracy": 1.0 if found is not None and found.group(1).strip() == example.answer else 0.0,
        "format": 1.0 if _TEMPLATE.fullmatch(text) else 0.0,
    }


@dataclass(frozen=True)
class ResponseFormat:
    """What a model writes after the prompt (``target``, without the end marker), how a completion
    is scored (``components``: name -> 0/1), and how many new tokens a rollout allows."""

    name: str
    target: Callable[[Example], str]
    components: Callable[[Example, str], dict[str, float]]
    component_names: tuple[str, ...]
    max_new_tokens: int

    def text(self, example: Example) -> str:
        """The whole training / calibration string: prompt, target and end marker."""
        return example.prompt + self.target(example) + END_MARKER

    def score(self, example: Example, completion: str) -> dict[str, float]:
        return self.components(example, completion)


def _reasoning_target(example: Example) -> str:
    pad = SCRATCHPADS[example.task](example)
    return f"{THINK_OPEN}{pad}{THINK_CLOSE}{ANSWER_OPEN}{example.answer}{ANSWER_CLOSE}"


FORMATS: dict[str, ResponseFormat] = {
    f.name: f
    for f in (
        # 8 answer characters + the end marker; a few spare tokens so a wrong model can ramble a bit
        ResponseFormat("answer", lambda ex: ex.answer, _answer_components, ("accuracy",), 12),
        # longest target is 63 characters (multiplication) + the end marker (tested)
        ResponseFormat("reasoning", _reasoning_target, _reasoning_components, ("accuracy", "format"), 72),
    )
}


def get_format(name: str | None) -> ResponseFormat:
    name = name or DEFAULT_FORMAT
    if name not in FORMATS:
        raise UnknownFormat(f"unknown response format {name!r}; known: {sorted(FORMATS)}")
    return FORMATS[name]


def format_of_config(config: Mapping) -> ResponseFormat:
    """The response format a checkpoint's ``config.json`` names (``answer`` when it names none)."""
    return get_format(config.get(CONFIG_KEY))


def score_batch(fmt: ResponseFormat, examples: Sequence[Example],
                completions: Sequence[str]) -> list[dict[str, float]]:
    if len(examples) != len(completions):
        raise ValueError("examples and completions differ in length")
    return [fmt.score(e, c) for e, c in zip(examples, completions)]
