"""Drafter training configuration (no torch import, so the CLI can show its defaults cheaply)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainConfig:
    num_layers: int = 6
    #: which verifier layers the drafter starts from (None: the first ``num_layers``)
    layers: tuple[int, ...] | None = None
    gamma: int = 16
    blocks_per_seq: int = 24
    batch_seqs: int = 4
    steps: int = 1500
    lr: float = 5e-4
    warmup: int = 50
    weight_decay: float = 0.0
    max_context: int = 768
    full_mask_share: float = 0.5
    #: loss weight of block position j (1-based) is j ** -position_decay: early positions decide
    #: how long an accepted prefix is
    position_decay: float = 0.5
    holdout: int = 64
    seed: int = 0
    dtype: str = "bfloat16"
    checkpoint_every: int = 50
    eval_every: int = 250
    #: held-out blocks per evaluation (at the decoding defaults' gamma and reveal steps)
    eval_blocks: int = 100
    threads: int | None = None
    #: the network reads the copy hint (DrafterSpec.copy_input)
    copy_input: bool = True
