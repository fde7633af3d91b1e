"""Separating siblings: when the top candidates tie on the same evidence, say what would tell them apart.

Classes of one family move the same metrics: a precision fault, a wrong kernel and a stale weight
sync all lift the rollout/trainer discrepancy at the onset, and on a run that logs only that they
score within a few hundredths of each other on the same evidence lines (issue 17, item 4). The
ranking between them is then noise, and the useful answer is which metric or test would separate
them. :data:`SEPARATORS` holds that knowledge per fault class (a registry: adding a class is
adding an entry); :func:`sibling_notes` finds the tie in a ranking and writes the note.

Every sentence is about this project's faults as ``reproduction/faults.py`` injects them and the
shipped library measured them (``signatures/library/fingerprints.json``); "the library's runs"
means those proxy runs.

Pure: no numpy, no web, no database. ``Candidate`` is imported for typing only, since
``matching.py`` imports this module.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moeproxy.signatures.matching import Candidate, MetricMatch

HEALTHY = "healthy"
DEFAULT_MARGIN = 0.05
#: Two candidates share their evidence when the metrics each one agrees on overlap this much
#: (Jaccard index against the anchor's set, see :func:`agreeing_metrics`).
SHARED_EVIDENCE_MIN_JACCARD = 0.5
SHARED_SHOWN = 3  # shared metrics named in the one-line text (all of them are in shared_evidence)


@dataclass(frozen=True)
class SeparatingMetric:
    """A metric that tells ``fault_class`` (the registry key) apart from the classes in ``against``.

    ``canonical`` is the name the matcher compares (vocabulary.CANONICAL_METRICS, or a logged name
    that is its own canonical name, such as ``actor/kl_coef``); ``logged_as`` the name a user adds
    to the trainer's logger; ``shows`` a clause with the class as its subject, saying what it does
    to the metric (the note joins the clauses of all tied classes about one metric)."""

    canonical: str
    logged_as: str
    shows: str
    against: frozenset[str] = frozenset()  # empty: against any sibling


@dataclass(frozen=True)
class SeparatingTest:
    """Something to try on the run (rerun, recompute, compare weights) that separates the class."""

    text: str
    against: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Separator:
    metrics: tuple[SeparatingMetric, ...] = ()
    tests: tuple[SeparatingTest, ...] = ()


def _against(*classes: str) -> frozenset[str]:
    return frozenset(classes)


_MISMATCH = ("rollout_logp_precision", "operator_numeric_noise", "stale_weight_sync", "routing_mismatch")
_NOT_LEARNING = ("actor_update_omission", "reward_fault", "lr_misconfiguration", "kl_misconfiguration")
M, T = SeparatingMetric, SeparatingTest

#: fault class -> what tells it apart from the siblings it is confused with (SPEC section 3,
#: reproduction/catalogue.py and reproduction/faults.py for what each fault moves).
SEPARATORS: dict[str, Separator] = {
    "rollout_logp_precision": Separator(
        metrics=(
            M("rollout_train_logp_diff", "training/rollout_probs_diff_mean",
              "rollout_logp_precision lifts it at the onset and then holds it flat: the rounding error "
              "is the same on every step",
              _against("stale_weight_sync", "operator_numeric_noise")),
            M("routing_agreement", "moe/routing_agreement",
              "rollout_logp_precision leaves it where it was when only the rollout's logits and "
              "log-softmax are in bf16/fp16 (the injector's default scope)",
              _against("operator_numeric_noise", "routing_mismatch", "stale_weight_sync")),
        ),
        tests=(
            T("recompute one batch's rollout log-probs in fp32: a precision fault's discrepancy "
              "disappears, a kernel fault's, a stale sync's or a routing mismatch's stays",
              _against("operator_numeric_noise", "stale_weight_sync", "routing_mismatch")),
        ),
    ),
    "operator_numeric_noise": Separator(
        metrics=(
            M("rollout_kl", "rollout_corr/k3_kl",
              "operator_numeric_noise confined to low-probability tokens (softmax_low_prob_tail) shows "
              "more in this log-space estimator than in the probability-space "
              "training/rollout_probs_diff_mean (|Δp| stays small where p < 0.05)",
              _against("rollout_logp_precision", "stale_weight_sync", "routing_mismatch")),
            M("importance_ratio_min", "rollout_corr/rollout_is_min",
              "a larger kernel error (operator_numeric_noise) drives the smallest token ratio down, where "
              "rollout_logp_precision left it in place in the library's runs",
              _against("rollout_logp_precision")),
            M("response_length", "response_length/mean",
              "operator_numeric_noise in attention (attention_seq_len) grows with the sequence length, so "
              "its discrepancy follows the response length",
              _against("rollout_logp_precision", "stale_weight_sync")),
        ),
        tests=(
            T("run the suspect kernel (attention, softmax) of the trainer on the rollout side for one "
              "batch: a kernel fault's discrepancy disappears, a precision fault's or a stale sync's stays",
              _against(*_MISMATCH)),
            T("split one batch's token discrepancy by position in the sequence: an attention kernel whose "
              "error grows with length gives a discrepancy that rises along the sequence, a precision fault "
              "or a stale sync one that does not",
              _against("rollout_logp_precision", "stale_weight_sync")),
        ),
    ),
    "stale_weight_sync": Separator(
        metrics=(
            M("rollout_train_logp_diff", "training/rollout_probs_diff_mean",
              "stale_weight_sync leaves the mismatch growing with the steps since the last sync, and with "
              "syncs only every N steps it falls back to its floor right after each one (a saw-tooth of "
              "period N)",
              _against("rollout_logp_precision", "operator_numeric_noise", "routing_mismatch")),
            M("routing_agreement", "moe/routing_agreement",
              "stale_weight_sync lowers it gradually, as the trainer's routers move away from the "
              "rollout's old copy (a falling trend after the onset in the library's runs)",
              _against("routing_mismatch", "operator_numeric_noise", "rollout_logp_precision")),
        ),
        tests=(
            T("compare a checksum of the rollout engine's weights with the trainer's after a sync (or read "
              "verl's timing_s/sync: a skipped sync takes no time): a stale sync leaves them different, "
              "all of them or the part never synced; precision, kernel and router-logit faults leave "
              "them equal",
              _against("rollout_logp_precision", "operator_numeric_noise", "routing_mismatch")),
            T("force a full weight sync on every step for a few steps: a stale sync's discrepancy falls back "
              "to its floor, a precision, kernel or routing fault's stays",
              _against("rollout_logp_precision", "operator_numeric_noise", "routing_mismatch")),
        ),
    ),
    "routing_mismatch": Separator(
        metrics=(
            M("routing_agreement", "moe/routing_agreement",
              "routing_mismatch perturbs the rollout's router logits before top-k, so it drops at the onset, "
              "to ×0.78 of its baseline or lower in the library's runs, where an attention-kernel error "
              "lowered it by 2–5% and a logits-only precision fault not at all",
              _against("operator_numeric_noise", "rollout_logp_precision", "stale_weight_sync",
                       "router_corruption")),
        ),
        tests=(
            T("give the trainer the rollout's expert choices for one batch (replay the routing): a routing "
              "mismatch's discrepancy disappears, a precision or kernel fault's stays",
              _against("operator_numeric_noise", "rollout_logp_precision", "stale_weight_sync")),
        ),
    ),
    "router_corruption": Separator(
        metrics=(
            M("expert_entropy", "moe/expert_entropy",
              "router_corruption shifts the trainer's expert use at the onset step, where a rollout/trainer "
              "mismatch leaves the trainer's own routing as it was",
              _against(*_MISMATCH)),
            M("kl", "actor/kl_loss",
              "router_corruption lifts the KL to the (undamaged) reference at the onset step itself, where "
              "the mismatch faults moved it later (17 steps for a stale sync) or not at all in the library's "
              "runs",
              _against(*_MISMATCH)),
            M("routing_agreement", "moe/routing_agreement",
              "router_corruption by noise or re-initialised rows damages the router both sides share and "
              "leaves it unchanged (downcast_bf16 rounds only the rollout's copy and lowers it like a "
              "routing mismatch)",
              _against("routing_mismatch")),
            M("balance_loss", "aux_loss",
              "router_corruption by noise, re-initialised or rescaled rows raises the MoE load-balancing "
              "loss from its step on (0.8-21% in real TRL runs with noise at the routers' own scale or "
              "more, a quarter or more of their rows re-initialised or an eighth of them x4; under 0.5% "
              "for milder damage; TRL logs it as aux_loss when the model's router_aux_loss_coef is not "
              "0), where reward, update and KL faults leave it level or falling",
              _against("reward_fault", "actor_update_omission", "kl_misconfiguration", HEALTHY)),
            M("router_outside_change", "moeproxy/router_outside_change",
              "router_corruption that happens during training (a down-cast, a merge, a reload between steps) "
              "moves the routers' weights between two optimizer steps, where nothing else does "
              "(MoeproxyCallback sends it for transformers and TRL trainers)",
              _against("reward_fault", "actor_update_omission", "kl_misconfiguration", "lr_misconfiguration",
                       HEALTHY)),
        ),
        tests=(
            T("compare the router weights with the last good checkpoint's: router_corruption's noise or "
              "re-initialised rows show in the weights themselves, the mismatch faults leave the trainer's "
              "weights as training made them",
              _against(*_MISMATCH)),
        ),
    ),
    "gradient_overflow": Separator(
        metrics=(
            M("pg_loss", "actor/pg_loss",
              "gradient_overflow's NaN/inf starts in the forward pass or in fp16 loss scaling and reaches "
              "the loss (at once, or once an applied step has put it into the weights), where "
              "actor_update_omission's non-finite grad norm (nonfinite_grad_norm) leaves the loss finite",
              _against("actor_update_omission")),
            M("grad_norm", "actor/grad_norm",
              "gradient_overflow makes it NaN/inf, a too-high learning rate makes it spike but stay finite",
              _against("lr_misconfiguration")),
        ),
        tests=(
            T("check whether the weights turn non-finite after the first NaN step: an overflow whose step is "
              "applied (fp16 loss scaling without overflow handling) puts NaN into the weights, a skipped "
              "step does not",
              _against("actor_update_omission")),
        ),
    ),
    "actor_update_omission": Separator(
        metrics=(
            M("ppo_kl", "actor/ppo_kl",
              "actor_update_omission by a skipped optimizer step (skip_step, nonfinite_grad_norm) freezes it "
              "at exactly 0 from the onset, where a reward fault still lets the optimizer step and keeps it "
              "non-zero",
              _against("reward_fault", "lr_misconfiguration", "kl_misconfiguration", HEALTHY)),
            M("grad_norm", "actor/grad_norm",
              "actor_update_omission logs exactly 0 with zeroed gradients (zero_grad), a normal norm when "
              "the step is skipped (skip_step), NaN with a finite loss when a non-finite norm makes the "
              "trainer skip it",
              _against("gradient_overflow", "reward_fault")),
            M("update_ratio_min", "moeproxy/update_ratio_min",
              "actor_update_omission leaves the weights exactly where they were on the steps it drops, with "
              "a finite gradient norm, where every other fault lets the optimizer move them "
              "(MoeproxyCallback sends it for transformers and TRL trainers)",
              _against("reward_fault", "lr_misconfiguration", "kl_misconfiguration", "gradient_overflow", HEALTHY)),
        ),
        tests=(
            T("compare the weights of two checkpoints a few steps apart: unchanged weights (barely changed "
              "with zeroed gradients, which AdamW's momentum still moves) mean the update was omitted",
              _against("reward_fault", "lr_misconfiguration", "kl_misconfiguration", HEALTHY)),
        ),
    ),
    "lr_misconfiguration": Separator(
        metrics=(
            M("lr", "actor/lr",
              "lr_misconfiguration is a setting: the logged learning rate's peak sits far above the RL "
              "recipes' 1e-6 (verl's GRPO examples, TRL's GRPOConfig default) from step 0; a healthy run, or "
              "a KL, reward, update or router fault, runs at the learning rate it was meant to have",
              _against("kl_misconfiguration", "reward_fault", "actor_update_omission", "router_corruption",
                       HEALTHY)),
            M("ppo_kl", "actor/ppo_kl",
              "lr_misconfiguration makes every update larger, so the per-update KL spreads and spikes; under "
              "AdamW the size of an update is set by the learning rate, not by the KL term",
              _against("kl_misconfiguration")),
        ),
        tests=(
            T("rerun a few steps from the last good checkpoint with the recipe's learning rate (1e-6 for "
              "verl's and TRL's GRPO): an LR fault goes away, a KL-coefficient, reward or update fault "
              "does not",
              _against("kl_misconfiguration", "reward_fault", "actor_update_omission")),
        ),
    ),
    "kl_misconfiguration": Separator(
        metrics=(
            M("actor/kl_coef", "actor/kl_coef",
              "kl_misconfiguration by a coefficient of 0 in the configuration is logged as 0 from step 0 "
              "(verl logs the configured coefficient); a sign flip or an unclamped low_var_kl in code leaves "
              "the logged value as configured, so a normal value does not rule them out",
              _against("lr_misconfiguration", "reward_fault", HEALTHY)),
        ),
        tests=(
            T("rerun a few steps with the KL term switched off: a sign-flipped or unclamped KL term's "
              "runaway stops, an LR fault's does not",
              _against("lr_misconfiguration")),
            T("in a TRL run, a missing kl metric means beta is 0 (TRL logs no kl then)",
              _against("lr_misconfiguration", "reward_fault", HEALTHY)),
        ),
    ),
    "reward_fault": Separator(
        metrics=(
            M("zero_std_frac", "frac_reward_zero_std",
              "reward_fault by a constant reward ties every group, so it goes to 1 and every advantage to 0, "
              "where an omitted update or an LR fault leaves the rewards varying within groups",
              _against("actor_update_omission", "lr_misconfiguration", "kl_misconfiguration")),
            M("reward_component", "rewards/<function>/mean",
              "reward_fault by a parser that never matches (component_zero) holds one component at exactly 0 "
              "while the others move",
              _against(*_NOT_LEARNING, "router_corruption")),
        ),
        tests=(
            T("score a handful of logged completions with the reward function alone: a broken reward "
              "scores them wrong, an omitted update or an LR fault scores them right",
              _against("actor_update_omission", "lr_misconfiguration", "kl_misconfiguration")),
        ),
    ),
    HEALTHY: Separator(
        metrics=(
            M("rollout_train_logp_diff", "training/rollout_probs_diff_mean",
              "a healthy run keeps it flat and below 0.005, where the verl FAQ calls above 0.01 a problem"),
            M("reward_mean", "critic/score/mean",
              "a healthy run's reward rises, a fault that stops learning leaves it flat or falling"),
            M("kl", "actor/kl_loss",
              "a healthy run's KL to the reference grows slowly, without a jump"),
        ),
        tests=(
            T("rerun from the last checkpoint before the onset: a fault that lives in code or configuration "
              "comes back at the same point, a fluctuation of one run does not"),
        ),
    ),
}

del M, T


@dataclass(frozen=True)
class SiblingNote:
    """Candidates that tie on shared evidence, and what would separate them."""

    classes: tuple[str, ...]
    scores: tuple[float, ...]
    shared_evidence: tuple[str, ...]  # logged names the tied candidates' evidence rests on in common
    separate_by: tuple[str, ...]  # "log X: …" (not logged yet), then "look at X: …", then tests
    text: str  # one sentence for the page and the Slack message

    def to_dict(self) -> dict[str, Any]:
        return {
            "classes": list(self.classes),
            "scores": [round(s, 4) for s in self.scores],
            "shared_evidence": list(self.shared_evidence),
            "separate_by": list(self.separate_by),
            "text": self.text,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SiblingNote:
        return cls(
            classes=tuple(data.get("classes", ())),
            scores=tuple(float(s) for s in data.get("scores", ())),
            shared_evidence=tuple(data.get("shared_evidence", ())),
            separate_by=tuple(data.get("separate_by", ())),
            text=str(data.get("text", "")),
        )


def agreeing_metrics(candidate: Candidate) -> frozenset[str]:
    """The canonical metrics a candidate's evidence rests on: affected metrics the run logs that
    moved the way the fingerprint expects (direction score 1 and a change), froze where its runs
    froze, or stayed flat where the fingerprint's healthy twins moved (an *affected* metric expected
    flat: a reward that never rises under a fault present from step 0). Agreeing on "no change" of
    an unaffected metric is not evidence: every class that leaves the metric alone would share it."""
    return frozenset(m.metric for m in candidate.matches if _agrees(m))


def _agrees(m: MetricMatch) -> bool:
    if not m.affected or m.observed_direction is None:
        return False
    if m.nonfinite_score is not None and m.nonfinite_score <= 0:
        return False
    agreed = (m.direction_score or 0.0) >= 1.0
    moved = agreed and m.observed_direction != 0
    stayed = agreed and m.expected_direction == 0 and m.observed_direction == 0
    return moved or stayed or (m.freeze_score or 0.0) >= 0.5


def jaccard(a: Collection[str], b: Collection[str]) -> float:
    a, b = set(a), set(b)
    return len(a & b) / len(a | b) if a | b else 0.0


def sibling_notes(candidates: Sequence[Candidate], *, logged: Collection[str] = (),
                  margin: float = DEFAULT_MARGIN) -> tuple[SiblingNote, ...]:
    """The note on the top candidate's tie, or () when there is none.

    ``candidates`` are ranked best first. The group is the top candidate plus every next one within
    ``margin`` of its score that shares its evidence: Jaccard(agreeing metrics) ≥ 0.5 with the
    *anchor*, the top candidate (``healthy`` never joins a fault's group). When ``healthy`` is on
    top, its evidence is the absence of change and has nothing to overlap: the best fault within
    the margin joins as the anchor, and further faults join when they share the anchor's evidence.
    ``logged`` holds the canonical names the run logs (metrics seen in the candidates' matches
    count as logged too): a separating metric among them is suggested as "look at", not "log"."""
    group = _tied_group(candidates, margin)
    if len(group) < 2:
        return ()
    faults = [c for c in group if c.fault_class != HEALTHY]
    shared_canonical = frozenset.intersection(*(agreeing_metrics(c) for c in faults))
    source_of = _sources(group)
    shared = tuple(source_of.get(m, m) for m in sorted(shared_canonical, key=_match_order(faults[0])))
    classes = tuple(c.fault_class for c in group)
    note = SiblingNote(
        classes=classes,
        scores=tuple(c.score for c in group),
        shared_evidence=shared,
        separate_by=separating_sentences(classes, logged=set(logged) | set(source_of), source_of=source_of),
        text=_text(group, shared, margin),
    )
    return (note,)


def _tied_group(candidates: Sequence[Candidate], margin: float) -> list[Candidate]:
    if not candidates:
        return []
    top = candidates[0]
    # Within the margin under the top. One that scores above it ranks under it only because the top
    # is strong by definition (matching.by_definition): that order is a definition, not noise.
    close = [c for c in candidates[1:]
             if c.fault_class != HEALTHY and 0.0 <= top.score - c.score <= margin + 1e-12]
    if top.fault_class == HEALTHY:
        if not close:
            return [top]
        anchor, rest = close[0], close[1:]
        group = [top, anchor]
    else:
        anchor, rest, group = top, close, [top]
        if not agreeing_metrics(anchor):
            return group  # a top candidate with no evidence of its own shares none
    anchor_set = agreeing_metrics(anchor)
    group += [c for c in rest if jaccard(agreeing_metrics(c), anchor_set) >= SHARED_EVIDENCE_MIN_JACCARD]
    return group


def _sources(group: Sequence[Candidate]) -> dict[str, str]:
    """canonical -> the name this run logs it under (from the metrics the run has)."""
    out: dict[str, str] = {}
    for c in group:
        for m in c.matches:
            if m.observed_direction is not None:
                out.setdefault(m.metric, m.source)
    return out


def _match_order(candidate: Candidate):
    order = {m.metric: i for i, m in enumerate(candidate.matches)}
    return lambda name: (order.get(name, len(order)), name)


def separating_sentences(classes: Sequence[str], *, logged: Collection[str] = (),
                         source_of: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """What separates ``classes`` from each other, from :data:`SEPARATORS`: one sentence per metric
    (the clauses of every tied class about it joined), metrics the run does not log first ("log X"),
    then those it logs ("look at X", under the run's own name), then the tests."""
    source_of = source_of or {}
    clauses: dict[str, list[str]] = {}
    names: dict[str, str] = {}
    tests: list[str] = []
    for cls in classes:
        sep = SEPARATORS.get(cls)
        if sep is None:
            continue
        others = set(classes) - {cls}
        for metric in sep.metrics:
            if _applies(metric.against, others) and metric.shows not in clauses.get(metric.canonical, ()):
                clauses.setdefault(metric.canonical, []).append(metric.shows)
                names.setdefault(metric.canonical, metric.logged_as)
        tests += [t.text for t in sep.tests if _applies(t.against, others) and t.text not in tests]
    to_log = [f"log {names[m]}: {'; '.join(c)}" for m, c in clauses.items() if m not in logged]
    to_look = [f"look at {source_of.get(m, names[m])}: {'; '.join(c)}"
               for m, c in clauses.items() if m in logged]
    return (*to_log, *to_look, *tests)


def _applies(against: frozenset[str], others: Collection[str]) -> bool:
    return not against or bool(against & set(others))


def _text(group: Sequence[Candidate], shared: Sequence[str], margin: float) -> str:
    scored = _and([f"{c.fault_class} ({c.score:.2f})" for c in group])
    evidence = ", ".join(shared[:SHARED_SHOWN]) + (", …" if len(shared) > SHARED_SHOWN else "")
    if group[0].fault_class == HEALTHY:
        them = "it" if len(group) == 2 else "them"
        at_stake = f" (the changes at stake: {evidence})" if shared else ""
        return (f"{scored} score within {margin:.2f}: this run does not tell a healthy run from {them} "
                f"yet{at_stake}.")
    return (f"{scored} score within {margin:.2f} of each other on the same evidence ({evidence}): "
            "this run does not tell them apart yet.")


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


__all__ = [
    "DEFAULT_MARGIN",
    "SEPARATORS",
    "SeparatingMetric",
    "SeparatingTest",
    "Separator",
    "SiblingNote",
    "agreeing_metrics",
    "separating_sentences",
    "sibling_notes",
]
