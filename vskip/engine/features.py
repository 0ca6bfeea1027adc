"""The 19 scalar features of A.7 for each position of a draft block."""

from __future__ import annotations

import numpy as np

from .models.protocols import DRAFT_FEATURES

LOOP_FEATURES = ("block_position", "generated_length", "segment_position", "is_humaneval", "is_math")
FEATURE_NAMES = DRAFT_FEATURES + LOOP_FEATURES
assert len(FEATURE_NAMES) == 19

#: Dataset indicator columns per task.
DATASET_FLAGS = {"humaneval": (1.0, 0.0), "math500": (0.0, 1.0), "mbpp": (0.0, 0.0), "gsm8k": (0.0, 0.0)}


def assemble_features(draft_features: np.ndarray, generated: int, D: int, task: str | None) -> np.ndarray:
    """Append the loop's features to the drafter's: block position j (1-based), generated length
    before the block, segment position (unverified tokens before position j: ``D + j - 1``) and the
    HumanEval / MATH indicators. Returns float32 [gamma, 19]."""
    gamma = draft_features.shape[0]
    assert draft_features.shape == (gamma, len(DRAFT_FEATURES)), draft_features.shape
    j = np.arange(1, gamma + 1, dtype=np.float32)
    he, ma = DATASET_FLAGS.get(task or "", (0.0, 0.0))
    extra = np.stack(
        [j, np.full(gamma, generated, np.float32), D + j - 1, np.full(gamma, he, np.float32), np.full(gamma, ma, np.float32)],
        axis=1,
    )
    return np.concatenate([draft_features.astype(np.float32), extra.astype(np.float32)], axis=1)
