"""One decode's settings, checked together once.

A :class:`Settings` holds what a user asked for: the policy, the decode configuration, the models
and the predictor directory. Building one runs every check that needs the settings alone
(:func:`vskip.engine.decode.check_settings`), before any model loads; the decode loop then checks
only what the settings ask of the models they meet (:func:`vskip.engine.decode.check_models`).
Every command that decodes builds one (:func:`vskip.commands.flags.settings`) and opens the decode
through :func:`vskip.study.door.open_decoder`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .decode import DecodeConfig, check_settings
from .models.config import ModelConfig
from .policy import PolicyConfig


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
