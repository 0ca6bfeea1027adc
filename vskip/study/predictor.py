"""Learned survival predictors (§4.2, A.7): 5-fold training on Strict SDD traces and online use.

One per-position MLP, ``(d_model + 19) -> 256 -> 256 -> 256 -> 1`` with GELU and dropout 0.1
after the first two hidden layers, reads the drafter's LM-head input at the reveal step and the 19
scalar features of A.7 (inputs normalised with the training folds' mean and standard deviation).

- marginal survival ``a_j = Pr(L >= j | F)``: labels ``1{L >= j}`` on every block;
- conditional survival ``s_j = Pr(L >= j | L >= j - 1, F)``: labels on the at-risk set
  (:func:`vskip.study.traces.survival_labels`).

Five rotations (A.7): rotation ``r`` tests fold ``r``, validates on ``(r + 1) mod 5`` (checkpoint
selection only) and trains on the other three. Online, a prompt is scored by the rotation whose
test fold holds it, so no prompt is ever scored by a model that saw it.

Layout of ``vskip train-predictor --kind KIND --out DIR``::

    DIR/KIND/manifest.json              folds, settings and training curves of every rotation
    DIR/KIND/rotation_<r>.safetensors   weights, normalisation, fold membership, kind, gamma
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..engine.features import FEATURE_NAMES
from ..files import own_dir, write_atomic
from .rotations import (MANIFEST, Rotation, hidden_rows, owner_of, read_rotations, rotation_file, rotations,
                        save_rotation, test_owners)
from .traces import FOLD_SEED, KINDS, N_FOLDS, TraceSet, folds, survival_labels

FORMAT = "vskip-predictor/1"
HIDDEN = 256
DROPOUT = 0.1


def make_mlp(n_in: int) -> nn.Sequential:
    """``n_in -> 256 -> 256 -> 256 -> 1``; GELU, dropout after the first two hidden layers."""
    return nn.Sequential(
        nn.Linear(n_in, HIDDEN), nn.GELU(), nn.Dropout(DROPOUT),
        nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Dropout(DROPOUT),
        nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, 1),
    )


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Examples:
    """Training rows of one kind: block index, position index (0-based) and label."""

    block: np.ndarray
    pos: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(self.y.shape[0])


def examples(ts: TraceSet, kind: str, blocks: np.ndarray) -> Examples:
    """The labelled positions of ``kind`` among the selected blocks (boolean [B])."""
    y, mask = survival_labels(kind, ts.L, ts.gamma)
    b, j = np.nonzero(mask & blocks[:, None])
    return Examples(b, j, y[b, j])


def input_rows(ts: TraceSet, b: np.ndarray, j: np.ndarray) -> np.ndarray:
    """float32 [n, d_model + 19]: hidden state then the scalar features of positions (b, j)."""
    f = ts.features[b, j].astype(np.float32)
    if ts.hidden is None:
        return f
    return np.concatenate([ts.hidden[b, j].astype(np.float32), f], axis=1)


def normalisation(ts: TraceSet, ex: Examples, chunk: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of the inputs over ``ex`` (the training folds only). A
    constant input gets standard deviation 1, so it maps to zero."""
    n_in = ts.d_model + len(FEATURE_NAMES)
    s = np.zeros(n_in)
    s2 = np.zeros(n_in)
    for i in range(0, len(ex), chunk):
        x = input_rows(ts, ex.block[i : i + chunk], ex.pos[i : i + chunk]).astype(np.float64)
        s += x.sum(0)
        s2 += (x * x).sum(0)
    n = max(len(ex), 1)
    mean = s / n
    std = np.sqrt(np.maximum(s2 / n - mean * mean, 0.0))
    std[std < 1e-6] = 1.0
    return mean.astype(np.float32), std.astype(np.float32)


# ----------------------------------------------------------------------------- training


@dataclass(frozen=True)
class PredictorTrainConfig:
    """A.7 defaults: 15 epochs, batches of 4,096 positions, Adam at 1e-3, seed 0 (online)."""

    kind: str
    epochs: int = 15
    seed: int = 0
    batch_size: int = 4096
    lr: float = 1e-3
    device: str = "cpu"
    fold_seed: int = FOLD_SEED
    k: int = N_FOLDS

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown predictor kind {self.kind!r}; expected marginal or conditional")
        if self.epochs < 1:
            raise ValueError(f"--epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")


def _bce(model: nn.Module, ts: TraceSet, ex: Examples, mean: torch.Tensor, std: torch.Tensor,
         device: str, batch: int) -> float:
    """Mean BCE of ``model`` (eval mode) over ``ex``."""
    model.eval()
    total = 0.0
    with torch.inference_mode():
        for i in range(0, len(ex), batch):
            x = torch.from_numpy(input_rows(ts, ex.block[i : i + batch], ex.pos[i : i + batch])).to(device)
            y = torch.from_numpy(ex.y[i : i + batch]).to(device)
            z = model((x - mean) / std).squeeze(1)
            total += float(nn.functional.binary_cross_entropy_with_logits(z, y, reduction="sum"))
    return total / max(len(ex), 1)


def train_rotation(ts: TraceSet, rot: Rotation, cfg: PredictorTrainConfig, bar=None) -> dict:
    """Train one rotation; returns its best state, normalisation and curves."""
    device = cfg.device
    tr = examples(ts, cfg.kind, ts.blocks_of(rot.train))
    va = examples(ts, cfg.kind, ts.blocks_of(rot.val))
    if len(tr) == 0 or len(va) == 0:
        raise ValueError(f"rotation {rot.index} has no {'training' if len(tr) == 0 else 'validation'} "
                         f"positions; trace more prompts")
    mean_np, std_np = normalisation(ts, tr)
    mean, std = torch.from_numpy(mean_np).to(device), torch.from_numpy(std_np).to(device)
    torch.manual_seed(cfg.seed)
    order_rng = np.random.RandomState(cfg.seed)
    model = make_mlp(mean_np.shape[0]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    best = (float("inf"), 0, None)
    train_curve, val_curve = [], []
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        order = order_rng.permutation(len(tr))
        total = 0.0
        for i in range(0, len(tr), cfg.batch_size):
            idx = order[i : i + cfg.batch_size]
            x = torch.from_numpy(input_rows(ts, tr.block[idx], tr.pos[idx])).to(device)
            y = torch.from_numpy(tr.y[idx]).to(device)
            loss = loss_fn(model((x - mean) / std).squeeze(1), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        train_curve.append(total / len(tr))
        val = _bce(model, ts, va, mean, std, device, cfg.batch_size)
        val_curve.append(val)
        if val < best[0]:
            best = (val, epoch, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
        if bar is not None:
            bar.update(1)
            bar.set_postfix(rotation=rot.index, val_bce=f"{val:.4f}")
    return {"state": best[2], "best_epoch": best[1], "val_bce": best[0], "mean": mean_np, "std": std_np,
            "train_curve": train_curve, "val_curve": val_curve, "n_train": len(tr), "n_val": len(va)}


def train_predictor(ts: TraceSet, cfg: PredictorTrainConfig, out: str | Path, progress: bool = True) -> dict:
    """Train the five rotations of ``cfg.kind`` on ``ts`` and write them under ``out/KIND/``;
    returns the manifest (also written as ``manifest.json``, last)."""
    from tqdm import tqdm

    if ts.hidden is None:
        print("vskip: note: the traces hold no hidden states; training on the 19 scalar features only",
              file=sys.stderr)
    fl = folds(ts.prompt_ids, seed=cfg.fold_seed, k=cfg.k)
    rots = rotations(fl)
    kdir = own_dir(Path(out) / cfg.kind)
    entries = []
    bar = tqdm(total=cfg.epochs * len(rots), desc=f"train {cfg.kind}", unit="epoch", disable=not progress,
               file=sys.stderr)
    with bar:
        for rot in rots:
            res = train_rotation(ts, rot, cfg, bar)
            meta = {
                "format": FORMAT, "kind": cfg.kind, "gamma": str(ts.gamma), "d_model": str(ts.d_model),
                "rotation": str(rot.index), "n_folds": str(len(rots)), "fold_seed": str(cfg.fold_seed),
                "seed": str(cfg.seed), "feature_names": list(FEATURE_NAMES),
                "test_ids": list(rot.test), "val_ids": list(rot.val), "train_ids": list(rot.train),
                "best_epoch": str(res["best_epoch"]), "val_bce": repr(res["val_bce"]),
            }
            save_rotation(kdir / rotation_file(rot.index), res["state"], res["mean"], res["std"], meta)
            entries.append({
                "rotation": rot.index, "file": rotation_file(rot.index), "test_fold": rot.index,
                "val_fold": (rot.index + 1) % len(rots), "best_epoch": res["best_epoch"],
                "val_bce": res["val_bce"], "train_bce_curve": res["train_curve"], "val_bce_curve": res["val_curve"],
                "n_train_positions": res["n_train"], "n_val_positions": res["n_val"],
            })
    manifest = {
        "format": FORMAT, "kind": cfg.kind, "gamma": ts.gamma, "d_model": ts.d_model,
        "n_inputs": ts.d_model + len(FEATURE_NAMES), "feature_names": list(FEATURE_NAMES),
        "fold_seed": cfg.fold_seed, "n_folds": len(rots), "folds": [list(f) for f in fl],
        "epochs": cfg.epochs, "seed": cfg.seed, "batch_size": cfg.batch_size, "lr": cfg.lr,
        "traces": list(ts.runs), "n_prompts": len(ts.prompt_ids), "n_blocks": ts.n_blocks,
        "dropped_short_blocks": ts.dropped_short, "dropped_unknown_L_blocks": ts.dropped_unknown_L,
        "rotations": entries,
    }
    write_atomic(kdir / MANIFEST, json.dumps(manifest, indent=1))
    return manifest


# ----------------------------------------------------------------------------- online use


@dataclass
class _RotationModel:
    rotation: Rotation
    model: nn.Sequential
    mean: torch.Tensor
    std: torch.Tensor


class FoldPredictor:
    """The five rotations of one kind. :meth:`scores` scores a prompt's block with the rotation
    whose test fold holds the prompt (the :class:`vskip.engine.models.protocols.Predictor` protocol)."""

    #: only the prefix model is calibrated online
    online = None

    def __init__(self, kind: str, gamma: int, d_model: int, models: Sequence[_RotationModel], device: str = "cpu",
                 path: str | None = None):
        self.kind = kind
        self.gamma = gamma
        self.d_model = d_model
        self.device = device
        self.path = path
        self._models = list(models)
        self._owner = test_owners([(m.rotation.index, m.rotation.test, m.rotation.train + m.rotation.val)
                                   for m in self._models], path)

    @property
    def rotations(self) -> list[Rotation]:
        return [m.rotation for m in self._models]

    @property
    def prompt_ids(self) -> list[str]:
        return list(self._owner)

    def rotation_of(self, task_id: str | None) -> int:
        """Index of the rotation whose test fold holds ``task_id``."""
        return owner_of(self._owner, task_id, self.kind, self.path)

    def _forward(self, i: int, x: torch.Tensor) -> torch.Tensor:
        m = self._models[i]
        return m.model((x - m.mean) / m.std).squeeze(-1)

    def scores(self, block, features: np.ndarray, task_id: str | None = None) -> np.ndarray:
        """float64 [gamma] in [0, 1]: the predicted survival of each position of ``block``.

        ``features``: float32 [gamma, 19]; ``block.hidden``: [gamma, d_model] array or tensor
        (any device or dtype; rounded through float16 as the traces store it)."""
        i = self.rotation_of(task_id)
        g = features.shape[0]
        assert features.shape == (g, len(FEATURE_NAMES)), features.shape
        x = torch.as_tensor(np.asarray(features, np.float32), device=self.device)
        if self.d_model:
            x = torch.cat([hidden_rows(block, g, self.d_model, self.device), x], dim=1)
        with torch.inference_mode():
            p = torch.sigmoid(self._forward(i, x))
        return p.double().cpu().numpy()

    def score_traces(self, ts: TraceSet, batch: int = 65536) -> np.ndarray:
        """Held-out scores of every traced block: float64 [B, gamma], each block scored by the
        rotation whose test fold holds its prompt."""
        for tid in ts.prompt_ids:
            self.rotation_of(tid)
        if self.d_model and ts.d_model != self.d_model:
            raise ValueError(f"traces have d_model = {ts.d_model}, the predictor {self.d_model}")
        out = np.full((ts.n_blocks, ts.gamma), np.nan)
        owner = np.array([self._owner[t] for t in ts.prompt_ids], dtype=np.int64)
        block_owner = owner[ts.prompt] if ts.n_blocks else owner[:0]
        b_all, j_all = np.nonzero(np.ones((ts.n_blocks, ts.gamma), bool))
        for i in range(len(self._models)):
            sel = block_owner[b_all] == i
            b, j = b_all[sel], j_all[sel]
            for s in range(0, b.size, batch):
                x = torch.from_numpy(_predictor_rows(ts, b[s : s + batch], j[s : s + batch], self.d_model))
                with torch.inference_mode():
                    out[b[s : s + batch], j[s : s + batch]] = torch.sigmoid(self._forward(i, x.to(self.device))).double().cpu().numpy()
        return out


def _predictor_rows(ts: TraceSet, b: np.ndarray, j: np.ndarray, d_model: int) -> np.ndarray:
    if d_model == 0:
        return ts.features[b, j].astype(np.float32)
    if ts.hidden is None:
        raise ValueError("the predictor reads hidden states; load the traces with their hidden states")
    return input_rows(ts, b, j)


def note_thresholds(predictor, alpha: float | None) -> None:
    """Print each fold's calibrated threshold at ``alpha`` to stderr, and say which folds have too
    few calibration prompts for it (their prompts are never skipped)."""
    if alpha is None or predictor.kind != "prefix":  # only the prefix model calibrates a threshold
        return
    rows = predictor.thresholds(alpha)
    print(f"vskip: alpha {alpha}: lam per fold " + ", ".join(f"{r}: {lam:g}" for r, _, lam in rows), file=sys.stderr)
    short = [(r, n) for r, n, lam in rows if lam == float("inf")]
    if short and predictor.online is not None:
        print(f"vskip: note: the online calibration found no threshold that keeps alpha {alpha} on its {short[0][1]} "
              "prompts, so this run never skips", file=sys.stderr)
    elif short:
        print(f"vskip: note: at alpha {alpha} conformal risk control needs at least {int(np.ceil(1 / alpha - 1))} "
              "calibration prompts; " + ", ".join(f"fold {r} has {n}" for r, n in short)
              + f", so {'its' if len(short) == 1 else 'their'} prompts are never skipped", file=sys.stderr)


def threshold_record(predictor, alpha: float | None) -> dict | None:
    """The calibrated thresholds a run decodes with, for its ``config.json``: ``alpha`` and, per
    rotation, its calibration prompts and ``lam`` (``None`` where the rotation never skips)."""
    if alpha is None or predictor.kind != "prefix":  # only the prefix model calibrates a threshold
        return None
    return {"alpha": alpha, "rotations": [
        {"rotation": r, "n_calibration": n, "lam": None if lam == float("inf") else lam}
        for r, n, lam in predictor.thresholds(alpha)]}


def load_predictor(path: str | Path | None, kind: str, runtime=None):
    """The trained predictor of ``kind`` under ``path`` (the ``--out`` of train-predictor): the
    five rotations of a marginal or conditional MLP, or of a prefix survival model."""
    if not path:
        raise ValueError(f"this policy reads a trained {kind} predictor: give --predictor DIR "
                         f"(see `vskip train-predictor --kind {kind}`)")
    if kind == "prefix":
        from .prefix.model import load_prefix_predictor

        return load_prefix_predictor(path, runtime)
    return load_fold_predictor(path, kind, runtime)


def load_fold_predictor(path: str | Path, kind: str, runtime=None) -> FoldPredictor:
    """Load the five rotations of ``kind`` from ``path`` (the ``--out`` of train-predictor) onto
    ``runtime.device`` (CPU without a runtime)."""
    if kind not in KINDS:
        raise ValueError(f"unknown predictor kind {kind!r}; expected marginal or conditional")
    device = getattr(runtime, "device", None) or "cpu"
    d, man, checkpoints = read_rotations(path, kind, FORMAT)
    gamma, d_model = int(man["gamma"]), int(man["d_model"])
    models = []
    for f, meta, tensors in checkpoints:
        if meta.get("kind") != kind or int(meta["gamma"]) != gamma or int(meta["d_model"]) != d_model:
            raise ValueError(f"{f} does not match its manifest (kind, gamma or d_model)")
        rot = Rotation(int(meta["rotation"]), tuple(json.loads(meta["test_ids"])),
                       train=tuple(json.loads(meta["train_ids"])), val=tuple(json.loads(meta["val_ids"])))
        mean, std = tensors.pop("norm.mean"), tensors.pop("norm.std")
        model = make_mlp(mean.shape[0])
        model.load_state_dict({k[len("mlp."):]: v for k, v in tensors.items()})
        model.eval().to(device)
        models.append(_RotationModel(rot, model, mean.to(device), std.to(device)))
    return FoldPredictor(kind, gamma, d_model, models, device=device, path=str(d))


def policy_predictor(s, runtime, record: dict | None = None, loaded: dict | None = None):
    """The trained predictor a learned policy of settings ``s`` reads (None for the others),
    checked against the settings its online thresholds hold for (``record``: the run's recorded
    settings); the loader :func:`vskip.engine.door.open_decoder` is handed. ``loaded``: predictors
    already read, by (kind, directory), which several configurations share."""
    if not s.policy.learned:
        return None
    from ..engine.door import settings_record
    from .prefix.calibrate import check_online_settings

    key = (s.policy.predictor_kind, s.predictor)
    predictor = (loaded or {}).get(key) or load_predictor(s.predictor, s.policy.predictor_kind, runtime)
    if loaded is not None:
        loaded[key] = predictor
    check_online_settings(predictor, record if record is not None else settings_record(s))
    note_thresholds(predictor, s.policy.alpha)
    return predictor
