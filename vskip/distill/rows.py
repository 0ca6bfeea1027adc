"""The distillation rows a drafter trains on: each answer with its prompt, the flagged prompts
left out, a held-out split of whole prompts, and the vocabulary the drafter's head emits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .shards import iter_distillation


@dataclass
class Data:
    rows: list[np.ndarray]  # prompt + completion ids
    prompt_lens: list[int]
    prompt_ids: list[str]

    def __len__(self):
        return len(self.rows)


def load_rows(data_dir: Path) -> Data:
    """Every answer of at least two tokens, except those of prompts ``leakage.json`` flags as
    resembling an evaluation item (:mod:`vskip.distill.leakage`)."""
    from .leakage import flagged_ids

    leaked = flagged_ids(Path(data_dir))
    rows, plens, pids = [], [], []
    for r in iter_distillation(Path(data_dir)):
        if len(r["completion"]) < 2 or r["prompt_id"] in leaked:
            continue
        rows.append(np.concatenate([r["prompt"], r["completion"]]).astype(np.int64))
        plens.append(len(r["prompt"]))
        pids.append(r["prompt_id"])
    if not rows:
        raise ValueError(f"no distillation rows in {data_dir}")
    return Data(rows, plens, pids)


def split(data: Data, holdout: int, seed: int) -> tuple[Data, Data]:
    """A held-out set of whole prompts for the acceptance estimate."""
    idx = np.random.RandomState(seed).permutation(len(data))
    ho = set(idx[: min(holdout, len(data) // 5)].tolist())
    pick = lambda keep: Data(*[[x[i] for i in range(len(data)) if (i in ho) == keep] for x in (data.rows, data.prompt_lens, data.prompt_ids)])
    return pick(False), pick(True)


def head_vocabulary(data: Data, eos_id: int) -> torch.Tensor:
    """Token ids the drafter's head can emit: every id seen in the training rows (answers and
    prompts: answers quote the code and text of their prompts), plus eos."""
    ids = {eos_id}
    for row in data.rows:
        ids.update(row.tolist())
    return torch.tensor(sorted(ids), dtype=torch.long)


def outside_head(data: Data, head: torch.Tensor) -> float | None:
    """Share of the answer tokens of ``data`` that the head cannot emit (None without answers)."""
    inside = np.zeros(int(max(int(head.max()), max((int(r.max()) for r in data.rows), default=0))) + 1, dtype=bool)
    inside[head.numpy()] = True
    answers = [r[p:] for r, p in zip(data.rows, data.prompt_lens)]
    n = sum(len(a) for a in answers)
    return float(sum(int((~inside[a]).sum()) for a in answers) / n) if n else None
