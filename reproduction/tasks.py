"""Synthetic verifiable task suite: the training data of the reference models,
the calibration text of the proxy builder and the RL environment of the
reproduction engine.

Every task has an exact answer of at most 8 characters, so a small character
model can learn it on a CPU and an RL rollout needs only a few new tokens.

Splits are disjoint *by prompt*: a prompt's split is decided by a stable hash of
``task|prompt`` (CRC-32, 80% train / 10% calibration / 10% held-out), and the
generators draw until they hit a prompt of the requested split.  So a held-out
prompt can never appear in any train split, whatever seeds were used.

Text format (see :mod:`moeproxy.reproduction.tokenizer`): the model reads
``<bos>`` + prompt and writes the answer followed by the end marker ``<eos>``;
``format_text`` gives the whole training string.

Pure Python: imports nothing heavy and no other stage.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Literal

#: The end-of-answer marker; it is the tokenizer's eos token.
END_MARKER = "<eos>"
#: Longest answer any task produces (tested).
MAX_ANSWER_CHARS = 8

Split = Literal["train", "calibration", "heldout"]
SPLITS: tuple[str, ...] = ("train", "calibration", "heldout")

# Buckets of crc32("task|prompt") % 20 per split.
_SPLIT_BUCKETS: dict[str, range] = {
    "train": range(16),
    "calibration": range(16, 18),
    "heldout": range(18, 20),
}
_MAX_DRAWS = 10_000


class UnknownTask(KeyError):
    """A task name that is not in :data:`TASKS`."""


@dataclass(frozen=True)
class Example:
    task: str
    prompt: str
    answer: str

    def __post_init__(self) -> None:
        if not self.prompt or not self.answer:
            raise ValueError("an example needs a non-empty prompt and answer")
        if len(self.answer) > MAX_ANSWER_CHARS:
            raise ValueError(f"answer {self.answer!r} longer than {MAX_ANSWER_CHARS} characters")


@dataclass(frozen=True)
class TaskFamily:
    """One task: a generator ``rng -> (prompt, answer)`` and a description."""

    name: str
    description: str
    generate: Callable[[random.Random], tuple[str, str]]

    def sample(self, rng: random.Random) -> Example:
        prompt, answer = self.generate(rng)
        return Example(task=self.name, prompt=prompt, answer=answer)


# --- generators ---------------------------------------------------------------------------------------

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_DIGITS = "0123456789"
_COUNT_ALPHABET = "abc"
_BRACKETS = {"(": ")", "[": "]", "{": "}"}


def _addition(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(100), rng.randrange(100)
    return f"{a}+{b}=", str(a + b)


def _subtraction(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(100), rng.randrange(100)
    a, b = max(a, b), min(a, b)  # non-negative results keep answers short
    return f"{a}-{b}=", str(a - b)


def _multiplication(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(1000), rng.randrange(10)
    return f"{a}*{b}=", str(a * b)


def _reversal(rng: random.Random) -> tuple[str, str]:
    s = "".join(rng.choice(_LETTERS) for _ in range(rng.randint(3, 7)))
    return f"rev:{s}=", s[::-1]


def _sorting(rng: random.Random) -> tuple[str, str]:
    s = "".join(rng.choice(_DIGITS) for _ in range(rng.randint(3, 8)))
    return f"sort:{s}=", "".join(sorted(s))


def _counting(rng: random.Random) -> tuple[str, str]:
    target = rng.choice(_COUNT_ALPHABET)
    s = "".join(rng.choice(_COUNT_ALPHABET) for _ in range(rng.randint(3, 9)))
    return f"count {target}:{s}=", str(s.count(target))


def is_balanced(seq: str) -> bool:
    """True if every bracket of ``()[]{}`` is closed in the right order."""
    closers = {v: k for k, v in _BRACKETS.items()}
    stack: list[str] = []
    for ch in seq:
        if ch in _BRACKETS:
            stack.append(ch)
        elif ch in closers:
            if not stack or stack.pop() != closers[ch]:
                return False
        else:
            raise ValueError(f"not a bracket: {ch!r}")
    return not stack


def _balanced_sequence(rng: random.Random, pairs: int) -> str:
    if pairs == 0:
        return ""
    inner = rng.randrange(pairs)
    opener = rng.choice(list(_BRACKETS))
    return (opener + _balanced_sequence(rng, inner) + _BRACKETS[opener]
            + _balanced_sequence(rng, pairs - 1 - inner))


def _brackets(rng: random.Random) -> tuple[str, str]:
    seq = _balanced_sequence(rng, rng.randint(4, 6))
    if rng.random() < 0.5:
        # Near misses teach more than random strings: change one character.
        chars = list(seq)
        i = rng.randrange(len(chars))
        chars[i] = rng.choice([c for c in "()[]{}" if c != chars[i]])
        seq = "".join(chars)
    return f"bal:{seq}=", "yes" if is_balanced(seq) else "no"


TASKS: dict[str, TaskFamily] = {
    f.name: f
    for f in (
        TaskFamily("addition", "sum of two numbers below 100", _addition),
        TaskFamily("subtraction", "difference a-b of two numbers below 100 with a >= b", _subtraction),
        TaskFamily("multiplication", "product of a number below 1000 and a digit", _multiplication),
        TaskFamily("reversal", "a string of 3-7 letters reversed", _reversal),
        TaskFamily("sorting", "the digits of a 3-8 digit string in ascending order", _sorting),
        TaskFamily("counting", "occurrences of a letter in a 3-9 letter string over abc", _counting),
        TaskFamily("brackets", "whether a ()[]{} sequence of 4-6 pairs is balanced: yes or no", _brackets),
    )
}


# --- splits -------------------------------------------------------------------------------------------

def split_of(example: Example) -> str:
    """The split a prompt belongs to (stable across processes and versions of Python)."""
    bucket = zlib.crc32(f"{example.task}|{example.prompt}".encode()) % 20
    return next(name for name, buckets in _SPLIT_BUCKETS.items() if bucket in buckets)


def _check_tasks(tasks: Sequence[str] | None) -> list[str]:
    names = list(TASKS) if tasks is None else list(tasks)
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise UnknownTask(f"unknown task(s) {unknown}; known: {sorted(TASKS)}")
    if not names:
        raise ValueError("no tasks selected")
    return names


def _draw(family: TaskFamily, split: str, rng: random.Random, seen: set[tuple[str, str]]) -> Example:
    fallback: Example | None = None
    for _ in range(_MAX_DRAWS):
        ex = family.sample(rng)
        if split_of(ex) != split:
            continue
        if (ex.task, ex.prompt) not in seen:
            return ex
        fallback = fallback or ex
    if fallback is None:
        raise RuntimeError(f"task {family.name!r} produced no prompt of split {split!r}")
    return fallback  # the split's prompt space is exhausted: repeat rather than leak another split


def make_split(split: Split, n: int, seed: int = 0, tasks: Sequence[str] | None = None) -> list[Example]:
    """``n`` examples in total from ``split``, tasks interleaved round-robin (so every task gets
    ``n // len(tasks)`` or one more).  Deterministic in ``(split, n, seed, tasks)``; prompts are
    distinct within the result while the split's prompt space allows it."""
    if split not in _SPLIT_BUCKETS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    if n < 0:
        raise ValueError("n must be >= 0")
    names = _check_tasks(tasks)
    rng = random.Random(f"moeproxy-tasks/{split}/{seed}")
    seen: set[tuple[str, str]] = set()
    out: list[Example] = []
    for i in range(n):
        ex = _draw(TASKS[names[i % len(names)]], split, rng, seen)
        seen.add((ex.task, ex.prompt))
        out.append(ex)
    return out


def iter_train(seed: int = 0, tasks: Sequence[str] | None = None):
    """An endless stream of train examples, tasks drawn uniformly (for training loops)."""
    names = _check_tasks(tasks)
    rng = random.Random(f"moeproxy-tasks/train-stream/{seed}")
    while True:
        family = TASKS[rng.choice(names)]
        ex = family.sample(rng)
        if split_of(ex) == "train":
            yield ex


# --- text format and reward ---------------------------------------------------------------------------

def format_prompt(example: Example) -> str:
    """What the model is given; the tokenizer adds ``<bos>`` in front."""
    return example.prompt


def format_text(example: Example) -> str:
    """The full training / calibration string: prompt, answer and end marker."""
    return example.prompt + example.answer + END_MARKER


def calibration_corpus(n_texts: int, seed: int = 0, tasks: Sequence[str] | None = None) -> list[str]:
    """Full prompt+answer texts from the calibration split, for the proxy builder's statistics."""
    return [format_text(ex) for ex in make_split("calibration", n_texts, seed=seed, tasks=tasks)]


def synthetic_calibration_source(arg: str) -> Iterator[str]:
    """The proxy builder's ``synthetic:`` calibration source: ``synthetic:tasks`` (every task
    family) or ``synthetic:addition,sorting``, calibration-split texts, as many as the builder asks for."""
    tasks = None if arg in ("", "tasks", "all") else [t.strip() for t in arg.split(",") if t.strip()]
    for seed in count():
        yield from calibration_corpus(512, seed=seed, tasks=tasks)


def register_synthetic_calibration() -> None:
    """Make ``synthetic:`` known to the proxy builder (which cannot import this stage itself):
    every caller that builds proxies on the task suite calls this first (the CLI, the loop)."""
    from moeproxy.proxy_builder.calibration import CALIBRATION_SOURCES, register_calibration_source

    if "synthetic" not in CALIBRATION_SOURCES:
        register_calibration_source("synthetic", synthetic_calibration_source)


def extract_answer(completion: str) -> str:
    """The answer part of a generated completion: everything before the first end marker (or the
    whole completion if the marker never came), padding tokens removed, surrounding whitespace
    stripped."""
    answer = completion.split(END_MARKER, 1)[0]
    return answer.replace("<pad>", "").strip()


def reward(example: Example, completion: str) -> float:
    """1.0 if the completion's answer (see :func:`extract_answer`) equals the expected answer
    exactly, else 0.0.  Tolerated: surrounding whitespace, a missing end marker, text after the end
    marker.  Not tolerated: anything else (case, leading zeros, extra characters)."""
    return 1.0 if extract_answer(completion) == example.answer else 0.0


def rewards(examples: Sequence[Example], completions: Sequence[str]) -> list[float]:
    if len(examples) != len(completions):
        raise ValueError("examples and completions differ in length")
    return [reward(e, c) for e, c in zip(examples, completions)]
