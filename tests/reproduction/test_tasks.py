"""Task generators, splits and the reward function of the synthetic suite."""

from __future__ import annotations

import random

import pytest
from moeproxy.reproduction import tasks
from moeproxy.reproduction.tasks import (
    END_MARKER,
    MAX_ANSWER_CHARS,
    TASKS,
    Example,
    UnknownTask,
    calibration_corpus,
    extract_answer,
    format_text,
    is_balanced,
    make_split,
    reward,
    split_of,
)

EXPECTED_TASKS = {"addition", "subtraction", "multiplication", "reversal", "sorting", "counting", "brackets"}


def _solve(ex: Example) -> str:
    """An independent solver written from the prompt text alone."""
    body = ex.prompt[:-1]  # drop the trailing "="
    if ex.task == "addition":
        a, b = body.split("+")
        return str(int(a) + int(b))
    if ex.task == "subtraction":
        a, b = body.split("-")
        return str(int(a) - int(b))
    if ex.task == "multiplication":
        a, b = body.split("*")
        return str(int(a) * int(b))
    if ex.task == "reversal":
        return body.removeprefix("rev:")[::-1]
    if ex.task == "sorting":
        return "".join(sorted(body.removeprefix("sort:")))
    if ex.task == "counting":
        head, s = body.split(":")
        return str(s.count(head.removeprefix("count ")))
    if ex.task == "brackets":
        seq = body.removeprefix("bal:")
        for _ in range(len(seq)):
            for pair in ("()", "[]", "{}"):
                seq = seq.replace(pair, "")
        return "yes" if seq == "" else "no"
    raise AssertionError(ex.task)


def test_registry_has_the_seven_families():
    assert set(TASKS) == EXPECTED_TASKS
    assert all(f.name == name for name, f in TASKS.items())


@pytest.mark.parametrize("name", sorted(EXPECTED_TASKS))
def test_generated_answers_are_exact_and_short(name):
    rng = random.Random(7)
    for _ in range(400):
        ex = TASKS[name].sample(rng)
        assert ex.task == name
        assert ex.prompt.endswith("=")
        assert 1 <= len(ex.answer) <= MAX_ANSWER_CHARS
        assert ex.answer == _solve(ex), ex


def test_sampling_is_deterministic_per_seed():
    a = [TASKS["sorting"].sample(random.Random(3)) for _ in range(3)]
    b = [TASKS["sorting"].sample(random.Random(3)) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize(
    "seq, balanced",
    [("()", True), ("([]{})", True), ("(]", False), ("(()", False), (")(", False), ("", True),
     ("{[()()]}", True), ("{[(])}", False)],
)
def test_is_balanced(seq, balanced):
    assert is_balanced(seq) is balanced


def test_brackets_answers_are_roughly_balanced_in_heldout():
    exs = make_split("heldout", 400, tasks=["brackets"])
    yes = sum(e.answer == "yes" for e in exs)
    assert 120 <= yes <= 280


def test_splits_are_disjoint_by_prompt():
    train = make_split("train", 7000, seed=0)
    train2 = make_split("train", 3000, seed=1)
    calib = make_split("calibration", 1400, seed=0)
    held = make_split("heldout", 1400, seed=0)
    assert {split_of(e) for e in train + train2} == {"train"}
    assert {split_of(e) for e in calib} == {"calibration"}
    assert {split_of(e) for e in held} == {"heldout"}
    keys = lambda xs: {(e.task, e.prompt) for e in xs}
    assert not keys(held) & (keys(train) | keys(train2) | keys(calib))
    assert not keys(calib) & keys(train)


def test_train_stream_stays_in_train_split():
    stream = tasks.iter_train(seed=0)
    exs = [next(stream) for _ in range(500)]
    assert {split_of(e) for e in exs} == {"train"}
    assert {e.task for e in exs} == EXPECTED_TASKS


def test_make_split_counts_determinism_and_uniqueness():
    held = make_split("heldout", 3500, seed=0)
    assert len(held) == 3500
    for name in EXPECTED_TASKS:
        prompts = [e.prompt for e in held if e.task == name]
        assert len(prompts) == 500
        assert len(set(prompts)) == 500  # 500 distinct held-out prompts per task, as the harness needs
    assert make_split("heldout", 50, seed=0) == held[:50]
    assert make_split("heldout", 50, seed=1) != held[:50]
    sub = make_split("calibration", 9, tasks=["addition", "reversal"])
    assert [e.task for e in sub] == ["addition", "reversal"] * 4 + ["addition"]


def test_make_split_rejects_bad_requests():
    with pytest.raises(UnknownTask):
        make_split("train", 3, tasks=["division"])
    with pytest.raises(ValueError):
        make_split("test", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        make_split("train", -1)
    assert make_split("train", 0) == []


def test_example_validation():
    with pytest.raises(ValueError):
        Example("addition", "1+1=", "")
    with pytest.raises(ValueError):
        Example("addition", "1+1=", "123456789")
    with pytest.raises(AttributeError):
        Example("addition", "1+1=", "2").answer = "3"  # type: ignore[misc]


def test_calibration_corpus_is_full_text():
    texts = calibration_corpus(14, seed=0)
    exs = make_split("calibration", 14, seed=0)
    assert texts == [format_text(e) for e in exs]
    assert all(t.endswith(END_MARKER) and "=" in t for t in texts)


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("46<eos>", 1.0),
        ("46", 1.0),  # no end marker (generation hit its token budget)
        (" 46 <eos>", 1.0),  # surrounding whitespace tolerated
        ("46<eos>junk after", 1.0),
        ("46<pad><pad>", 1.0),
        ("046<eos>", 0.0),  # leading zeros are wrong
        ("4<eos>6", 0.0),
        ("47<eos>", 0.0),
        ("46 7", 0.0),
        ("", 0.0),
        ("<eos>46", 0.0),
    ],
)
def test_reward_exact_match(completion, expected):
    ex = Example("addition", "12+34=", "46")
    assert reward(ex, completion) == expected


def test_reward_is_case_sensitive_and_extract():
    ex = Example("brackets", "bal:()()()()=", "yes")
    assert reward(ex, "YES<eos>") == 0.0
    assert extract_answer(" yes<eos>no") == "yes"
    assert tasks.rewards([ex, ex], ["yes", "no"]) == [1.0, 0.0]
    with pytest.raises(ValueError):
        tasks.rewards([ex], [])
