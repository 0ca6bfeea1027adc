"""Rotations of the fold protocol (A.7) and the files every learned predictor keeps them in.

:class:`Rotation` is the one notion of a fold's use: the prompts a rotation tests, fits on,
chooses its epoch with and (the prefix model) calibrates on; :func:`rotations` makes the signal
predictors' (the paper's), :func:`prefix_rotations` the prefix model's. Stored as one safetensors
checkpoint per rotation (weights, input normalisation and fold membership as metadata) and a
``manifest.json`` written last; which rotation tests a prompt; and the drafter's hidden states as
the predictors read them.

Both the paper's per-position MLPs (:mod:`vskip.study.predictor`) and the prefix survival model
(:mod:`vskip.study.prefix.model`) are stored and looked up through here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..files import own_dir, write_atomic

MANIFEST = "manifest.json"
#: share of a prefix rotation's training prompts held back to choose the epoch
STOP_SHARE = 0.15


@dataclass(frozen=True)
class Rotation:
    """Rotation ``index`` of the k folds, as disjoint sets of prompt ids: ``test`` (the fold it
    scores), ``train`` (fits the weights), ``val`` (chooses the epoch) and ``cal`` (calibrates the
    prefix model's thresholds; none for the signal predictors). The signal predictors validate on a
    fold of their own; the prefix model holds ``val`` back from its training folds."""

    index: int
    test: tuple[str, ...]
    train: tuple[str, ...]
    val: tuple[str, ...]
    cal: tuple[str, ...] = ()


def rotations(fold_list: Sequence[Sequence[str]]) -> list[Rotation]:
    """The signal predictors' (A.7): rotation ``r`` tests fold ``r``, validates on ``(r + 1) mod k``
    and trains on the others."""
    k = len(fold_list)
    out = []
    for r in range(k):
        v = (r + 1) % k
        train = tuple(p for f in range(k) if f not in (r, v) for p in fold_list[f])
        out.append(Rotation(r, tuple(fold_list[r]), train, tuple(fold_list[v])))
    return out


def prefix_rotations(fold_list: Sequence[Sequence[str]], calibration_folds: int = 1,
                     seed: int = 0) -> list[Rotation]:
    """The prefix model's: rotation ``r`` tests fold ``r``, calibrates on folds ``r+1 ..
    r+calibration_folds`` (mod k) and trains on the rest, of which :data:`STOP_SHARE` (seeded) is
    held back as ``val`` to choose the epoch."""
    k = len(fold_list)
    if not 1 <= calibration_folds <= k - 2:
        raise ValueError(f"--calibration-folds must lie in 1..{k - 2} with {k} folds, got {calibration_folds}")
    out = []
    for r in range(k):
        cal_f = {(r + i) % k for i in range(1, calibration_folds + 1)}
        cal = tuple(p for f in sorted(cal_f) for p in fold_list[f])
        rest = [p for f in range(k) if f != r and f not in cal_f for p in fold_list[f]]
        n_stop = max(1, int(round(STOP_SHARE * len(rest)))) if len(rest) > 1 else 0
        pick = set(np.random.RandomState(seed + r).permutation(len(rest))[:n_stop].tolist())
        out.append(Rotation(r, tuple(fold_list[r]), train=tuple(p for i, p in enumerate(rest) if i not in pick),
                            val=tuple(p for i, p in enumerate(rest) if i in pick), cal=cal))
    return out


def rotation_file(r: int) -> str:
    return f"rotation_{r}.safetensors"


def save_rotation(path: Path, state: dict, mean: np.ndarray, std: np.ndarray, meta: dict) -> None:
    """One checkpoint: ``mlp.*`` weights, ``norm.mean``/``norm.std``, and string metadata
    (kind, gamma, d_model, rotation, test/val/train prompt ids as JSON)."""
    from safetensors.torch import save_file

    tensors = {f"mlp.{k}": v.detach().cpu().float().contiguous() for k, v in state.items()}
    tensors["norm.mean"] = torch.from_numpy(np.asarray(mean, np.float32))
    tensors["norm.std"] = torch.from_numpy(np.asarray(std, np.float32))
    md = {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
    own_dir(Path(path).parent)
    write_atomic(Path(path), lambda tmp: save_file(tensors, tmp, metadata=md))


def find_predictor_dir(path: str | Path, kind: str) -> Path:
    """``path/KIND`` when it holds a manifest, else ``path`` itself when its manifest is of ``kind``."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"predictor directory {p} does not exist")
    for d in (p / kind, p):
        m = d / MANIFEST
        if m.exists():
            man = json.loads(m.read_text())
            if man.get("kind") == kind:
                return d
    raise ValueError(f"no {kind} predictor under {p} (train one with `vskip train-predictor --kind {kind} --out {p}`)")


def read_rotations(path: str | Path, kind: str, fmt: str) -> tuple[Path, dict, list]:
    """The directory, manifest and checkpoints ``(file, metadata, tensors)`` of the rotations of
    ``kind`` under ``path``, refusing a manifest of another format or a missing checkpoint."""
    from safetensors import safe_open

    d = find_predictor_dir(path, kind)
    man = json.loads((d / MANIFEST).read_text())
    if man.get("format") != fmt:
        raise ValueError(f"{d / MANIFEST} is not a vskip {kind} predictor manifest")
    out = []
    for e in man["rotations"]:
        f = d / e["file"]
        if not f.exists():
            raise FileNotFoundError(f"predictor checkpoint {f} is missing")
        with safe_open(str(f), framework="pt") as sf:
            out.append((f, sf.metadata() or {}, {k: sf.get_tensor(k) for k in sf.keys()}))
    return d, man, out


def test_owners(rotations: Sequence[tuple[int, Sequence[str], Sequence[str]]], path) -> dict[str, int]:
    """{prompt id: position of the rotation that tests it} from (index, test ids, ids it trained,
    validated or calibrated on) per rotation; refuses a prompt tested twice or seen by its tester."""
    owner: dict[str, int] = {}
    for i, (index, test, seen) in enumerate(rotations):
        if set(seen) & set(test):
            raise ValueError(f"rotation {index} of {path} trains or validates on its test prompts")
        for tid in test:
            if tid in owner:
                raise ValueError(f"prompt {tid} lies in two test folds of {path}")
            owner[tid] = i
    return owner


def owner_of(owner: dict[str, int], task_id: str | None, kind: str, path) -> int:
    """The rotation (of :func:`test_owners`) that scores ``task_id``."""
    if task_id is None:
        raise ValueError("a learned predictor needs the prompt's task id to choose its fold")
    try:
        return owner[str(task_id)]
    except KeyError:
        raise ValueError(
            f"prompt {task_id} lies in no test fold of the {kind} predictor at {path} "
            f"(trained on {len(owner)} prompts); train it on traces that include this prompt"
        ) from None


def hidden_rows(block, g: int, d_model: int, device: str = "cpu") -> torch.Tensor:
    """float32 [g, d_model] hidden states of ``block``, rounded through float16 as traces store them."""
    h = block.hidden
    if h is None:
        raise ValueError("the predictor reads hidden states but the drafter gave none")
    h = torch.as_tensor(h).to(device=device).to(torch.float16).float()
    if tuple(h.shape) != (g, d_model):
        raise ValueError(f"hidden states of shape {tuple(h.shape)} do not fit a predictor trained on "
                         f"d_model = {d_model}")
    return h
