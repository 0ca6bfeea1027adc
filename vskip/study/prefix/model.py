"""A prefix-level survival model: one network over the whole block that predicts ``P(L >= k)`` for
every prefix length ``k`` at once, monotone in ``k`` by construction, trained on the block's
accepted length (beyond the paper; see :mod:`vskip.engine.policy.prefix`).

The paper's learned signals score positions one at a time: marginal survival is trained on
``1{L >= j}``, and conditional survival on ``1{L >= j}`` among the blocks with ``L >= j - 1``. This
model sees the block as a sequence instead:
- each position's inputs (the A.7 features, standardised on the training folds) go through a small
  MLP;
- a GRU reads the positions left to right, so position ``j``'s hazard depends on every position up
  to ``j``;
- the hazards ``h_j = P(L = j - 1 | L >= j - 1)`` give ``S_k = prod_{j <= k} (1 - h_j)``.

It is trained with the likelihood of each block's ``L`` (:func:`vskip.engine.policy.prefix.survival_nll`
in torch). The folds follow the predictors' protocol (:func:`vskip.study.traces.folds`): a prompt is
scored only by the rotation whose test fold holds it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..rotations import (MANIFEST, Rotation, hidden_rows, owner_of, prefix_rotations, read_rotations, rotation_file,
                         save_rotation, test_owners)


class PrefixSurvivalNet(nn.Module):
    def __init__(self, n_in: int, hidden: int = 64):
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(n_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Hazard logits [B, gamma] of standardised inputs ``x`` [B, gamma, n_in]."""
        z, _ = self.gru(self.inp(x))
        return self.out(z).squeeze(-1)


def survival_nll_torch(logits: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of accepted lengths ``L`` [B] under hazard logits [B, gamma]:
    the first ``L`` positions survive (``log(1 - h) = logsigmoid(-z)``), position ``L + 1`` fails
    (``log h = logsigmoid(z)``; nothing when ``L == gamma``)."""
    B, g = logits.shape
    j = torch.arange(g, device=logits.device)[None, :]
    alive = (j < L[:, None]).float() * nn.functional.logsigmoid(-logits)
    at = torch.clamp(L, max=g - 1)
    fail = torch.where(L < g, nn.functional.logsigmoid(logits[torch.arange(B), at]), torch.zeros_like(L, dtype=logits.dtype))
    return -(alive.sum(1) + fail).mean()


@dataclass(frozen=True)
class PrefixTrainConfig:
    epochs: int = 30
    hidden: int = 64
    lr: float = 3e-3
    batch_size: int = 256
    seed: int = 0

    def __post_init__(self):
        if self.epochs < 1 or self.hidden < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError("epochs, hidden and batch_size must be >= 1 and lr > 0")


def train_prefix_model(X: np.ndarray, L: np.ndarray, cfg: PrefixTrainConfig = PrefixTrainConfig(),
                       X_val: np.ndarray | None = None, L_val: np.ndarray | None = None):
    """Fit a :class:`PrefixSurvivalNet` on blocks ``X`` [B, gamma, F] with accepted lengths ``L``
    [B]; keep the epoch with the lowest validation likelihood when a validation set is given.
    Returns (model, mean, std) for :func:`survival`."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    mean = X.reshape(-1, X.shape[-1]).mean(0)
    std = X.reshape(-1, X.shape[-1]).std(0)
    std[std < 1e-6] = 1.0
    model = PrefixSurvivalNet(X.shape[-1], cfg.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    xt = torch.from_numpy(((X - mean) / std).astype(np.float32))
    lt = torch.from_numpy(np.asarray(L, np.int64))
    best, best_state = float("inf"), None
    for _ in range(cfg.epochs):
        model.train()
        order = rng.permutation(len(xt))
        for i in range(0, len(order), cfg.batch_size):
            idx = torch.from_numpy(order[i : i + cfg.batch_size])
            loss = survival_nll_torch(model(xt[idx]), lt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if X_val is not None and len(X_val):
            v = float(nll(model, mean, std, X_val, L_val))
            if v < best:
                best, best_state = v, {k: t.clone() for k, t in model.state_dict().items()}
    if best_state is not None:
        model.load_state_dict(best_state)
    return model.eval(), mean, std


@torch.inference_mode()
def survival(model: PrefixSurvivalNet, mean: np.ndarray, std: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``P(L >= k)`` [B, gamma] of blocks ``X``: non-increasing in ``k``."""
    z = model(torch.from_numpy(((X - mean) / std).astype(np.float32)))
    return torch.cumprod(torch.sigmoid(-z), dim=1).double().numpy()


@torch.inference_mode()
def nll(model: PrefixSurvivalNet, mean: np.ndarray, std: np.ndarray, X: np.ndarray, L: np.ndarray) -> float:
    z = model(torch.from_numpy(((X - mean) / std).astype(np.float32)))
    return float(survival_nll_torch(z, torch.from_numpy(np.asarray(L, np.int64))))


def held_out_survival(X: np.ndarray, L: np.ndarray, prompt: np.ndarray, prompt_ids: Sequence[str],
                      rotations, cfg: PrefixTrainConfig = PrefixTrainConfig()) -> np.ndarray:
    """``P(L >= k)`` of every block, each scored by the model of the rotation whose test fold
    holds its prompt (trained on that rotation's training folds, the epoch chosen on its
    validation fold). ``prompt`` [B]: each block's index into ``prompt_ids``."""
    S = np.full(X.shape[:2], np.nan)
    index = {pid: i for i, pid in enumerate(prompt_ids)}
    for rot in rotations:
        part = {name: np.isin(prompt, [index[p] for p in getattr(rot, name) if p in index])
                for name in ("train", "val", "test")}
        if not part["test"].any():
            continue
        model, mean, std = train_prefix_model(X[part["train"]], L[part["train"]], cfg,
                                              X[part["val"]], L[part["val"]])
        S[part["test"]] = survival(model, mean, std, X[part["test"]])
    return S


# ----------------------------------------------------------------------------- fold predictor
#
# Rotation r of the prefix model (ours; the paper's learned predictors use A.7's rotations):
# it tests fold r, calibrates the threshold on the next ``calibration_folds`` folds, and trains on
# the others, choosing its epoch on a seeded share of the training prompts. So no prompt is scored
# by a model or a threshold that saw it, and the calibration prompts are exchangeable with the
# test prompts given the model (what conformal risk control needs).

FORMAT = "vskip-prefix-predictor/1"
KIND = "prefix"
def block_inputs(ts, blocks: np.ndarray) -> np.ndarray:
    """float32 [B', gamma, d_model + 19]: hidden states (when traced) then the A.7 features of the
    selected blocks (boolean [B])."""
    f = ts.features[blocks].astype(np.float32)
    if ts.hidden is None:
        return f
    return np.concatenate([ts.hidden[blocks].astype(np.float32), f], axis=2)


def _calibration_prompts(ts, model, mean, std, ids) -> list[tuple[np.ndarray, np.ndarray]]:
    """(survival, L) of each calibration prompt that has traced blocks."""
    out = []
    for pid in ids:
        sel = ts.blocks_of([pid])
        if sel.any():
            out.append((survival(model, mean, std, block_inputs(ts, sel)), ts.L[sel]))
    return out


def _training_blocks(ts, rounds, ids) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, L) of the blocks of prompts ``ids`` in the Strict SDD traces and in each round's
    on-policy traces (decoded while the scheduler skipped, L from the shadow verifier)."""
    parts = [(t, t.blocks_of(ids)) for t in (ts, *rounds)]
    return (np.concatenate([block_inputs(t, sel) for t, sel in parts]), np.concatenate([t.L[sel] for t, sel in parts]))


def train_prefix_predictor(ts, cfg: PrefixTrainConfig, out, calibration_folds: int = 1, progress: bool = True,
                           on_policy=None, calibrate_on: str = "strict") -> dict:
    """Train and calibrate the rotations of the prefix model on Strict SDD traces ``ts``; writes
    ``out/prefix/rotation_<r>.safetensors`` and ``manifest.json`` (last) and returns the manifest.

    ``on_policy``: traces decoded while a prefix scheduler skipped (shadow-verified, so every block
    has its L), added to each rotation's training prompts (DAgger-style rounds): one trace set, or
    one per round, oldest first, which are aggregated. The epoch is chosen on Strict SDD blocks.
    ``calibrate_on``: ``strict`` calibrates each threshold on the calibration prompts' Strict SDD
    blocks; ``on-policy`` on their on-policy blocks of the last round, the kind the newest model's
    policy meets after its own skips, where the losses still count tokens beyond the shadow
    verifier's ``L``."""
    from pathlib import Path

    from tqdm import tqdm

    from ...engine.policy.prefix import GRID, risk_curve
    from ...files import own_dir, write_json
    from ..traces import FOLD_SEED, N_FOLDS, folds

    if calibrate_on not in ("strict", "on-policy"):
        raise ValueError(f"calibrate_on must be strict or on-policy, got {calibrate_on!r}")
    rounds = [] if on_policy is None else [on_policy] if hasattr(on_policy, "gamma") else list(on_policy)
    if calibrate_on == "on-policy" and not rounds:
        raise ValueError("calibrating on on-policy blocks needs on-policy traces")
    for onp in rounds:
        if onp.gamma != ts.gamma or onp.d_model != ts.d_model:
            raise ValueError(f"the on-policy traces (gamma {onp.gamma}, d_model {onp.d_model}) do not match "
                             f"the Strict SDD traces (gamma {ts.gamma}, d_model {ts.d_model})")
    kdir = own_dir(Path(out) / KIND)
    fl = folds(ts.prompt_ids, seed=FOLD_SEED, k=N_FOLDS)
    entries = []
    for rot in tqdm(prefix_rotations(fl, calibration_folds, cfg.seed), desc="train prefix", unit="rotation",
                    disable=not progress):
        X, L = _training_blocks(ts, rounds, rot.train)
        st = ts.blocks_of(rot.val)
        if not len(L) or not st.any():
            raise ValueError(f"rotation {rot.index} has no training or epoch-choice blocks; trace more prompts")
        model, mean, std = train_prefix_model(X, L, cfg, block_inputs(ts, st), ts.L[st])
        cal = _calibration_prompts(ts if calibrate_on == "strict" else rounds[-1], model, mean, std, rot.cal)
        if not cal:
            raise ValueError(f"rotation {rot.index} has no calibration blocks; trace more prompts")
        risk = risk_curve(cal, GRID)
        meta = {"format": FORMAT, "kind": KIND, "gamma": str(ts.gamma), "d_model": str(ts.d_model),
                "rotation": str(rot.index), "hidden": str(cfg.hidden), "test_ids": list(rot.test),
                "cal_ids": list(rot.cal), "train_ids": list(rot.train), "stop_ids": list(rot.val),
                "grid": GRID.tolist(), "risk": risk.tolist(), "n_cal": str(len(cal))}
        save_rotation(kdir / rotation_file(rot.index), model.state_dict(), mean, std, meta)
        entries.append({"rotation": rot.index, "file": rotation_file(rot.index), "n_cal_prompts": len(cal),
                        "n_train_blocks": int(len(L)),
                        "stop_nll": nll(model, mean, std, block_inputs(ts, st), ts.L[st])})
    manifest = {"format": FORMAT, "kind": KIND, "gamma": ts.gamma, "d_model": ts.d_model,
                "train": asdict(cfg), "calibration_folds": calibration_folds, "calibrate_on": calibrate_on,
                "fold_seed": FOLD_SEED,
                "folds": [list(f) for f in fl], "traces": list(ts.runs),
                "on_policy_traces": [r for onp in rounds for r in onp.runs],
                "on_policy_rounds": [list(onp.runs) for onp in rounds],
                "calibration_traces": list((ts if calibrate_on == "strict" else rounds[-1]).runs),
                "n_prompts": len(ts.prompt_ids),
                "n_blocks": ts.n_blocks, "dropped_short_blocks": ts.dropped_short, "rotations": entries}
    write_json(kdir / MANIFEST, manifest, indent=1)
    return manifest


@dataclass
class _Rotation:
    rotation: Rotation
    model: PrefixSurvivalNet
    mean: np.ndarray
    std: np.ndarray
    grid: np.ndarray
    risk: np.ndarray
    n_cal: int


class PrefixPredictor:
    """The rotations of a prefix model. :meth:`scores` gives a block's per-position conditional
    survival ``1 - h_j`` (its running product is ``P(L >= k)``) from the rotation that tests the
    prompt; :meth:`threshold` gives the ``lam`` that rotation calibrated for a risk ``alpha``."""

    kind = KIND

    def __init__(self, gamma: int, d_model: int, rotations: Sequence[_Rotation], path: str | None = None,
                 online: dict | None = None):
        self.gamma, self.d_model, self.path = gamma, d_model, path
        self._rots = list(rotations)
        #: a one-rotation model calibrated online (:func:`write_online_predictor`): it scores its test
        #: and its calibration prompts, and its thresholds are ``online["thresholds"]``
        self.online = online
        if online is not None and len(self._rots) != 1:
            raise ValueError(f"{path}: an online-calibrated prefix model has one rotation, not {len(self._rots)}")
        self._owner = test_owners([(r.rotation.index, r.rotation.test + (r.rotation.cal if online else ()),
                                    r.rotation.train + r.rotation.val + (() if online else r.rotation.cal))
                                   for r in self._rots], path)

    @property
    def rotations(self) -> list[Rotation]:
        """As the diagnostics' position-only baseline reads them: fitted on every prompt of a
        rotation's training folds, which for this model include the share that chose its epoch
        (``train`` + ``val``); its calibration folds in the ``val`` place."""
        return [Rotation(r.rotation.index, r.rotation.test, r.rotation.train + r.rotation.val, r.rotation.cal)
                for r in self._rots]

    @property
    def online_ids(self) -> tuple[list[str], list[str]]:
        """(calibration ids, test ids) of a one-rotation model calibrated online."""
        if self.online is None:
            raise ValueError(f"{self.path} is not a model to calibrate online (make one with `vskip calibrate-online init`)")
        rot = self._rots[0].rotation
        return list(rot.cal), list(rot.test)

    def rotation_of(self, task_id: str | None) -> int:
        """The rotation that scores ``task_id``; a prompt of no data set (None: a server's request)
        takes the one rotation of an online-calibrated model, whose thresholds hold for new prompts
        of the population it was calibrated on."""
        if task_id is None and self.online is not None:
            return 0
        return owner_of(self._owner, task_id, KIND, self.path)

    def threshold(self, task_id: str | None, alpha: float) -> float:
        """The calibrated ``lam`` for ``task_id``'s rotation (``inf``: too few calibration prompts
        for ``alpha``, so never skip)."""
        from ...engine.policy.prefix import crc_threshold

        r = self._rots[self.rotation_of(task_id)]
        if self.online is not None:
            if str(task_id) in r.rotation.cal:
                raise ValueError(f"prompt {task_id} calibrated the online thresholds of {self.path}: decode it with "
                                 "--lam, or test the thresholds on the rotation's test prompts")
            return self._online_lam(alpha)
        return crc_threshold(r.grid, r.risk, r.n_cal, alpha).lam

    def _online_lam(self, alpha: float) -> float:
        lams = self.online.get("thresholds") or {}
        if f"{alpha:g}" not in lams:
            have = ", ".join(sorted(lams)) or "none yet"
            raise ValueError(f"{self.path} holds no online threshold for alpha {alpha:g} (calibrated: {have}); "
                             "choose one with `vskip calibrate-online choose`")
        lam = lams[f"{alpha:g}"]
        return float("inf") if lam is None else float(lam)

    def thresholds(self, alpha: float) -> list[tuple[int, int, float]]:
        """(rotation, calibration prompts, calibrated ``lam``) of every rotation at risk ``alpha``."""
        from ...engine.policy.prefix import crc_threshold

        if self.online is not None:
            r = self._rots[0]
            return [(r.rotation.index, len(r.rotation.cal), self._online_lam(alpha))]
        return [(r.rotation.index, r.n_cal, crc_threshold(r.grid, r.risk, r.n_cal, alpha).lam) for r in self._rots]

    def scores(self, block, features: np.ndarray, task_id: str | None = None) -> np.ndarray:
        r = self._rots[self.rotation_of(task_id)]
        x = np.asarray(features, np.float32)
        if self.d_model:
            x = np.concatenate([hidden_rows(block, x.shape[0], self.d_model).numpy(), x], axis=1)
        with torch.inference_mode():
            z = r.model(torch.from_numpy(((x - r.mean) / r.std).astype(np.float32))[None])[0]
        return torch.sigmoid(-z).double().numpy()

    def score_traces(self, ts) -> np.ndarray:
        """Held-out ``P(L >= k)`` [B, gamma] of every traced block, by the rotation that tests it."""
        S = np.full((ts.n_blocks, ts.gamma), np.nan)
        for i, r in enumerate(self._rots):
            sel = ts.blocks_of([p for p, o in self._owner.items() if o == i])
            if sel.any():
                S[sel] = survival(r.model, r.mean, r.std, block_inputs(ts, sel))
        return S


def load_prefix_predictor(path, runtime=None) -> PrefixPredictor:
    """Load ``path/prefix`` (or ``path`` itself) written by ``vskip train-predictor --kind prefix``.
    The model is small and runs on the CPU whatever ``runtime`` says."""
    import json

    d, man, checkpoints = read_rotations(path, KIND, FORMAT)
    rots = []
    for _, meta, tensors in checkpoints:
        ids = {k: tuple(json.loads(meta[f"{k}_ids"])) for k in ("test", "cal", "train", "stop")}
        ids["val"] = ids.pop("stop")  # the file's name for the share that chose the epoch
        mean, std = tensors.pop("norm.mean").numpy(), tensors.pop("norm.std").numpy()
        model = PrefixSurvivalNet(mean.shape[0], int(meta["hidden"]))
        model.load_state_dict({k[len("mlp."):]: v for k, v in tensors.items()})
        rots.append(_Rotation(Rotation(int(meta["rotation"]), **ids), model.eval(), mean, std,
                              np.asarray(json.loads(meta["grid"])), np.asarray(json.loads(meta["risk"])),
                              int(meta["n_cal"])))
    return PrefixPredictor(int(man["gamma"]), int(man["d_model"]), rots, path=str(d), online=man.get("online"))


def write_online_predictor(src, rotation: int, out) -> dict:
    """Copy rotation ``rotation`` of the prefix model at ``src`` to ``out/prefix`` as a model to be
    calibrated online (``vskip calibrate-online``): it scores the rotation's test prompts and its
    calibration prompts, neither of which it trained on, and ``--alpha`` reads the thresholds that
    :func:`vskip.study.prefix.calibrate.choose_online` writes into its manifest (none at first). Returns the
    manifest."""
    from pathlib import Path

    from ...files import copy_file, own_dir, write_json

    d, man, _ = read_rotations(src, KIND, FORMAT)
    if man.get("online"):
        raise ValueError(f"{d} is already a one-rotation model calibrated online; give the model it came from")
    entry = next((e for e in man["rotations"] if e["rotation"] == rotation), None)
    if entry is None:
        raise ValueError(f"{d} has no rotation {rotation} (it has {', '.join(str(e['rotation']) for e in man['rotations'])})")
    kdir = Path(out) / KIND
    if (kdir / MANIFEST).exists():
        raise ValueError(f"{kdir / MANIFEST} exists: choose a new --out")
    own_dir(kdir)
    copy_file(d / entry["file"], kdir / entry["file"])  # a link planted there is replaced, not written through
    manifest = {**man, "rotations": [entry], "online": {"source": str(src), "rotation": rotation, "thresholds": {}}}
    write_json(kdir / MANIFEST, manifest, indent=1)
    return manifest
