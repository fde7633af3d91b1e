"""What a run's configuration says that its metrics cannot.

A run is created with a ``config`` (SPEC section 4: ``POST /runs``; the TRL callback and the verl
tracker send the trainer's), and three whole-run rules need facts only that holds:

* whether the policy trains LoRA adapters. LoRA runs at learning rates 10-128x those of full
  fine-tuning (see ``levels.SOURCES["lora-lr"]``), so an LR that is a misconfiguration for the full
  model is a recipe for its adapters;
* the coefficient of the KL-to-reference term. A negative one rewards the policy for leaving its
  reference (``levels.SOURCES["kl-penalty"]``), and at a small coefficient the metrics of the first
  hundreds of steps look like a healthy run's: the config is the only place it shows;
* the policy's learning rate as configured, the value its schedule reaches after the warm-up. A
  logged LR that never comes near it (a warm-up longer than the run) trains at a fraction of what
  was set, and the LR alone looks like a warm-up (``levels.SOURCES["config-lr"]``).

:func:`settings_from_config` reads them from the names the frameworks use; a run whose config says
nothing is read as full fine-tuning with no stated coefficient, as before.

Pure: no numpy, no web, no database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunSettings:
    lora: bool = False  # the policy trains low-rank adapters (LoRA/QLoRA), not its own weights
    kl_coef: float | None = None  # the KL-to-reference coefficient the config states (None: none)
    kl_coef_max: float | None = None  # the largest, where it states several (a term too heavy)
    learning_rate: float | None = None  # the policy's learning rate the config states (None: none)


#: What a run whose config says nothing is read as: full fine-tuning.
DEFAULT_SETTINGS = RunSettings()

#: A positive rank under one of these names: verl's ``actor_rollout_ref.model.lora_rank``,
#: OpenRLHF's ``--lora_rank``, a script's own ``lora_r``.
LORA_RANK_KEYS = frozenset({"lora_rank", "lora_r"})
#: A true flag (or a non-empty section) under one of these names: TRL's ``ModelConfig.use_peft``,
#: scripts' ``use_lora``/``lora``.
LORA_FLAG_KEYS = frozenset({"use_peft", "use_lora", "lora"})
#: A non-empty section under one of these names: what the TRL callback sends for a PEFT model
#: (``peft``), peft's own attribute name (``peft_config``).
PEFT_SECTION_KEYS = frozenset({"peft", "peft_config"})
#: The KL-to-reference coefficient: TRL's ``GRPOConfig.beta`` (the TRL callback sends it under
#: ``training_args``), verl's ``actor_rollout_ref.actor.kl_loss_coef`` and
#: ``algorithm.kl_ctrl.kl_coef``, OpenRLHF's ``--init_kl_coef``.
KL_COEF_KEYS = frozenset({"beta", "kl_loss_coef", "kl_coef", "init_kl_coef"})
#: The policy's learning rate: transformers' ``TrainingArguments.learning_rate`` (TRL's configs; the
#: TRL callback sends them under ``training_args``), OpenRLHF's ``--actor_learning_rate``, and verl's
#: ``lr`` only inside its actor's section (``actor_rollout_ref.actor.optim.lr``; the critic has one too).
LR_KEYS = frozenset({"learning_rate", "actor_learning_rate"})
VERL_LR_KEY = "lr"
VERL_ACTOR_SECTION = "actor"
#: verl's switches for its two KL terms: a coefficient under a switch set to false is a default
#: left in the config (``kl_loss_coef: 0.001`` beside ``use_kl_loss: false``), not a term of the loss.
KL_SWITCHES: dict[str, str] = {"use_kl_loss": "kl_loss_coef", "use_kl_in_reward": "kl_coef"}
#: Bounds on the walk through a config (at most 256 KiB of JSON, SmallJson): deep or wide enough
#: for verl's nested Hydra config, small enough to cost nothing.
MAX_DEPTH = 8
MAX_NODES = 20_000


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _positive(value: Any) -> bool:
    return (n := _number(value)) is not None and n > 0


def _says_lora(key: str, value: Any) -> bool:
    k = key.lower()
    if k in LORA_RANK_KEYS:
        return _positive(value)
    section = isinstance(value, Mapping) and bool(value)
    if k in LORA_FLAG_KEYS:
        return value is True or section
    return k in PEFT_SECTION_KEYS and section


def _switched_off(node: Mapping[str, Any]) -> bool:
    """A section that turns PEFT off explicitly: TRL's ``ModelConfig`` dumped whole holds
    ``use_peft: False`` beside its default ``lora_r: 16``."""
    return any(isinstance(k, str) and k.lower() in LORA_FLAG_KEYS and v is False for k, v in node.items())


def settings_from_config(config: Mapping[str, Any] | None) -> RunSettings:
    """The settings a run's ``config`` states (any nesting); the defaults where it says nothing.
    Where it names several KL coefficients (verl's loss term and its reward penalty), the lowest
    is kept, a negative one being the misconfiguration whichever term it sits in, and the largest
    beside it, a term far too heavy being one too. A coefficient whose
    term the config switches off (:data:`KL_SWITCHES`, in its section or one above) is not read."""
    stack: list[tuple[Any, int, frozenset[str], bool]] = [(config, 0, frozenset(), False)]
    seen = 0
    lora = False
    kl_coefs: list[float] = []
    lrs: list[float] = []
    while stack and seen < MAX_NODES:
        node, depth, kl_off, in_actor = stack.pop()
        seen += 1
        if isinstance(node, Mapping):
            off = _switched_off(node)
            kl_off = kl_off | {coef for switch, coef in KL_SWITCHES.items() if node.get(switch) is False}
            for key, value in node.items():
                if not isinstance(key, str):
                    continue
                lora = lora or (not off and _says_lora(key, value))
                k = key.lower()
                if k in KL_COEF_KEYS and k not in kl_off and (coef := _number(value)) is not None:
                    kl_coefs.append(coef)
                if (k in LR_KEYS or (in_actor and k == VERL_LR_KEY)) and (lr := _number(value)) is not None:
                    lrs.append(lr)
                if depth < MAX_DEPTH:
                    stack.append((value, depth + 1, kl_off, in_actor or k == VERL_ACTOR_SECTION))
        elif isinstance(node, Sequence) and not isinstance(node, str | bytes) and depth < MAX_DEPTH:
            stack.extend((item, depth + 1, kl_off, in_actor) for item in node)
    # Several learning rates (a config dumped with its defaults beside the run's): the lowest, so an
    # LR judged too small against it is too small against every one of them.
    return RunSettings(lora=lora, kl_coef=min(kl_coefs) if kl_coefs else None,
                       kl_coef_max=max(kl_coefs) if kl_coefs else None,
                       learning_rate=min(lrs) if lrs else None)
