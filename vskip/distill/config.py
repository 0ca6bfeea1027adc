"""Drafter training configuration (no torch import, so the CLI can show its defaults cheaply)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..defaults import MAX_GAMMA


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
    #: share of block starts drawn from the first ``early_tokens`` tokens of an answer (the rest are
    #: uniform over the whole answer): a decode spends its blocks early, where answers repeat least
    early_share: float = 0.0
    early_tokens: int = 64
    #: held-out answers decoded again block by block over their first ``replay_tokens`` tokens at
    #: each evaluation (the decode path's tokens per call; 0: not measured)
    replay_answers: int = 48
    replay_tokens: int = 64
    #: a training directory whose latest weights (and head) this run starts from, with a fresh
    #: optimiser and schedule
    init_from: str | None = None

    def __post_init__(self):
        positive = ("num_layers", "gamma", "blocks_per_seq", "batch_seqs", "steps", "max_context", "checkpoint_every",
                    "eval_every", "eval_blocks", "early_tokens", "replay_tokens")
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"--{key.replace('_', '-')} must be >= 1, got {getattr(self, key)}")
        for key in ("lr", "weight_decay", "full_mask_share", "position_decay", "early_share"):
            if not math.isfinite(getattr(self, key)):
                raise ValueError(f"--{key.replace('_', '-')} must be a finite number, got {getattr(self, key)}")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.position_decay < 0:
            raise ValueError(f"--position-decay must be >= 0, got {self.position_decay}")
        if self.warmup < 0 or self.holdout < 0 or self.weight_decay < 0:
            raise ValueError("--warmup, --holdout and the weight decay must be >= 0")
        if not 0.0 <= self.early_share <= 1.0:
            raise ValueError(f"--early-share must lie in [0, 1], got {self.early_share}")
        if self.replay_answers < 0:
            raise ValueError(f"--replay-answers must be >= 0, got {self.replay_answers}")
        if not 0.0 <= self.full_mask_share <= 1.0:
            raise ValueError(f"--full-mask-share must lie in [0, 1], got {self.full_mask_share}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        if self.layers is not None and (not self.layers or len(set(self.layers)) != len(self.layers)
                                        or min(self.layers) < 0):
            raise ValueError(f"--layers must name distinct layer indices >= 0, got {list(self.layers)}")
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype must be bfloat16 or float32, got {self.dtype!r}")


@dataclass(frozen=True)
class ConditionedTrainConfig:
    num_layers: int = 2
    block_size: int = 16
    blocks_per_seq: int = 16
    batch_seqs: int = 4
    steps: int = 2800
    lr: float = 1e-3
    warmup: int = 50
    max_tail: int = 64
    #: share of training blocks whose context reaches the anchor (no unverified tail)
    no_tail_share: float = 0.5
    loss_decay: float = 7.0
    holdout: int = 64
    seed: int = 0
    checkpoint_every: int = 50
    eval_every: int = 400
    eval_blocks: int = 48
    replay_answers: int = 24
    replay_tokens: int = 128
    threads: int | None = None

    def __post_init__(self):
        for key in ("num_layers", "blocks_per_seq", "batch_seqs", "steps", "checkpoint_every", "eval_every",
                    "eval_blocks", "replay_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"--{key.replace('_', '-')} must be >= 1, got {getattr(self, key)}")
        if not 2 <= self.block_size <= MAX_GAMMA + 1:  # a draft of at most MAX_GAMMA tokens, as decoding allows
            raise ValueError(f"--block-size must lie in 2..{MAX_GAMMA + 1}, got {self.block_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)) or not (self.loss_decay > 0 and math.isfinite(self.loss_decay)):
            raise ValueError("--lr and --loss-decay must be finite and > 0")
        if not 0.0 <= self.no_tail_share <= 1.0:
            raise ValueError(f"--no-tail-share must lie in [0, 1], got {self.no_tail_share}")
        if self.max_tail < 0 or self.warmup < 0 or self.holdout < 0 or self.replay_answers < 0:
            raise ValueError("--max-tail, --warmup, --holdout and --replay-answers must be >= 0")
