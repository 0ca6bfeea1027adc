"""One decode's settings, checked together once.

A :class:`Settings` holds what a user asked for: the policy, the decode configuration
(:class:`DecodeConfig`), the models and the predictor directory. Building one runs every check
that needs the settings alone (:func:`check_settings`), before any model loads; the decode loop
then checks only what the settings ask of the models they meet (:func:`check_models`,
:func:`check_prompt`). Every command that decodes builds one (:func:`vskip.commands.flags.settings`) and opens the decode
through :func:`vskip.engine.door.open_decoder`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..defaults import DRAFTS, GAMMA, MAX_NEW_TOKENS
from .models.config import ModelConfig
from .models.protocols import Drafter, Verifier
from .policy import BlockLength, PolicyConfig, Sampling


@dataclass(frozen=True)
class DecodeConfig:
    """``gamma``: draft block length; ``max_new_tokens``: output budget; ``shadow``: recover L on
    skipped rounds (§3.2); ``trace``: keep the A.7 inputs of every block; ``task``: dataset name
    for the indicator features; ``gamma_max``/``min_match``: a block length per round, ``trim``:
    verify only the confident drafted prefix (:mod:`vskip.engine.policy.blocks`; None: the paper's
    fixed blocks); ``drafts``: where a lossless round's draft comes from, ``drafter`` (every round,
    the paper's) or ``payoff`` (each round the copy hint alone, the drafter or the verifier alone,
    whichever the measured costs say pays most, :mod:`vskip.engine.policy.payoff`; for Strict SDD
    and raw confidence, not under the speculative rule, without traces: raw confidence skips on a
    copied block's odds);
    ``sampling``: temperature 0 (greedy, the paper) or the verifier's sampling
    settings and seed (:mod:`vskip.engine.policy.sampling`)."""

    gamma: int = GAMMA
    max_new_tokens: int = MAX_NEW_TOKENS
    shadow: bool = True
    trace: bool = False
    task: str | None = None
    gamma_max: int | None = None
    min_match: int = 8
    trim: float | None = None
    sampling: Sampling = Sampling()
    drafts: str = "drafter"

    def __post_init__(self):
        if isinstance(self.sampling, dict):  # read back from a run directory's config.json
            object.__setattr__(self, "sampling", Sampling(**self.sampling))
        self.blocks  # validates gamma, gamma_max, min_match and trim
        if self.trace and self.trim is not None:
            raise ValueError("traces need the strict length L of whole blocks: collect them without --trim")
        if self.drafts not in DRAFTS:
            raise ValueError(f"drafts must be one of {', '.join(DRAFTS)}, got {self.drafts!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max-new-tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def blocks(self) -> BlockLength:
        return BlockLength(self.gamma, self.gamma_max, self.min_match, self.trim)


def check_prompt(prompt: Sequence[int], verifier: Verifier, cfg: DecodeConfig) -> None:
    if len(prompt) == 0:
        raise ValueError("the prompt is empty")
    need = len(prompt) + cfg.max_new_tokens + cfg.blocks.longest + 1
    if need > verifier.max_length:
        raise ValueError(
            f"prompt of {len(prompt)} tokens + {cfg.max_new_tokens} new tokens + a block of "
            f"{cfg.blocks.longest} exceeds the verifier's context of {verifier.max_length} tokens"
        )


def check_settings(policy: PolicyConfig, cfg: DecodeConfig, steps: int | None = None) -> None:
    """The rules that tie a policy to decode settings, checked once where settings are made
    (:class:`vskip.engine.settings.Settings`): trimming only where it cannot change what is accepted,
    lenience and top-k greedy only, and the speculative rule only for a drafter that drafts in one
    forward (``steps``; None: checked against the drafter by :func:`check_models`)."""
    if cfg.drafts == "payoff" and policy.name not in ("ar", "strict", "raw"):
        raise ValueError(f"--drafts payoff chooses each round's draft for strict (lossless) and raw (which skips "
                         f"on a copied block's odds); {policy.name} scores the drafter's block every round: use "
                         f"--drafts drafter")
    if cfg.trim is not None and policy.lossy_acceptance:
        raise ValueError(f"--trim would change what {policy.name} accepts; use it with strict or a skip policy")
    if not cfg.sampling.greedy and policy.lossy_acceptance:
        raise ValueError(f"{policy.name} acceptance is defined on the verifier's argmax; it takes no --temperature")
    if steps is not None and policy.uses_drafter:
        check_speculative(cfg.sampling, steps)


def check_speculative(sampling: Sampling, steps: int) -> None:
    """The speculative rule is exact only for a drafter that drafts its block in one forward."""
    if sampling.speculative and steps != 1:
        raise ValueError(f"--speculative-sampling needs a drafter that drafts its block in one forward (--steps 1), "
                         f"not in {steps} reveal steps")


def check_models(drafter: Drafter | None, policy: PolicyConfig, cfg: DecodeConfig, predictor) -> None:
    """What the settings ask of the models they meet: a drafter (drafting blocks this long, in one
    forward for the speculative rule) and a predictor where the policy needs them."""
    if not policy.uses_drafter:
        return
    if drafter is None:
        raise ValueError(f"policy {policy.name!r} needs a drafter")
    if drafter.max_gamma is not None and cfg.blocks.longest > drafter.max_gamma:
        raise ValueError(f"this drafter drafts at most {drafter.max_gamma} tokens a block; "
                         f"--gamma {cfg.blocks.longest} is more")
    check_speculative(cfg.sampling, drafter.steps)
    if policy.learned and predictor is None:
        raise ValueError(f"policy {policy.name!r} needs a trained predictor")




@dataclass(frozen=True)
class Settings:
    policy: PolicyConfig
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    models: ModelConfig = field(default_factory=ModelConfig)
    #: directory of trained predictors (learned policies)
    predictor: str | None = None

    def __post_init__(self):
        check_settings(self.policy, self.decode, self.models.steps)
        kind = self.policy.predictor_kind
        if kind is not None and not self.predictor:
            raise ValueError(f"this policy reads a trained {kind} predictor: give --predictor DIR "
                             f"(see `vskip train-predictor --kind {kind}`)")

    @property
    def longest_block(self) -> int:
        """The longest block a round drafts: what the memory plan and the warm-up use."""
        return self.decode.blocks.longest
