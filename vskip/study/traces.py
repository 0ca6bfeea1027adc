"""Block traces for the learned predictors (A.7): storage, loading, folds and survival labels.

A ``--trace`` run keeps the predictor inputs of every draft block. They are stored column-wise,
one safetensors file per prompt under ``RUN_DIR/traces/`` (never pickle), each written once,
atomically, when the prompt finishes, so a resumed run only writes the prompts it decodes. Per
draft position (``n`` positions over all the prompt's blocks, in decoding order):

=============  ================  =========================================================
tensor         dtype, shape      meaning
=============  ================  =========================================================
features       float32 [n, 19]   the A.7 scalar features (:data:`vskip.engine.features.FEATURE_NAMES`)
hidden         float16 [n, d]    LM-head input at the reveal step (absent if the drafter gave none)
confidence     float32 [n]       raw confidence ``q_j = p_draft(x̂_j)``
block          int32   [n]       block index within the prompt (0, 1, ...)
position       int32   [n]       position ``j`` in the block (1-based)
round          int32   [n]       decoding round of the block
L              int32   [n]       strict accepted length of the block (-1: unknown)
K              int32   [n]       committed skip length of the block (0 on a strict round)
=============  ================  =========================================================

The file's metadata holds the task id, the run's ``gamma`` and ``d_model``. Only full-length
blocks (``gamma`` positions) with a known ``L`` are used for training and diagnostics: the final,
shortened block of a prompt has other positions and is never skipped (the shortened-block guard).

Nothing here imports torch.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..engine.features import FEATURE_NAMES
from ..engine.policy import LEARNED
from ..files import check_input_dir, own_dir, read_jsonl, write_atomic
from .rundir import CONFIG, SAMPLES, TRACE_DIR  # noqa: E402

FORMAT = "vskip-traces/1"
#: The fold protocol of A.7.
FOLD_SEED = 12345
N_FOLDS = 5
KINDS = LEARNED

_F16_MAX = float(np.finfo(np.float16).max)


# ----------------------------------------------------------------------------- writing


def trace_path(run_dir: str | Path, task_id: str) -> Path:
    """The trace file of one prompt: the task id percent-encoded (``HumanEval%2F3``)."""
    return Path(run_dir) / TRACE_DIR / (urllib.parse.quote(str(task_id), safe="") + ".safetensors")


def _run_config(run_dir: Path) -> dict | None:
    """The resolved run configuration of ``config.json`` when it names a policy and a gamma."""
    p = run_dir / CONFIG
    if not p.exists():
        return None
    try:
        run = json.loads(p.read_text())["run"]
        run["policy"]["name"], int(run["decode"]["gamma"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return run


def run_policy(run_dir: str | Path) -> str | None:
    """The ``--policy`` a run directory was decoded with (None without a ``config.json``)."""
    cfg = _run_config(Path(run_dir))
    return cfg["policy"]["name"] if cfg else None


def append_traces(run_dir: str | Path, task_id: str, traces: Sequence, gamma: int | None = None) -> Path:
    """Write the block traces of one finished prompt to ``run_dir/traces/``.

    ``traces``: :class:`vskip.engine.decode.BlockTrace` objects in decoding order. ``gamma``: the run's
    block length; by default read from the run's ``config.json``, else the longest block. The file
    appears atomically (temporary file, then rename); a prompt decoded again after an interrupted
    run replaces its file with the trace of the decode that the run's samples record.
    """
    from safetensors.numpy import save_file

    run_dir = Path(run_dir)
    if not traces:
        raise ValueError(f"no block traces for {task_id}")
    if gamma is None:
        cfg = _run_config(run_dir)
        gamma = int(cfg["decode"]["gamma"]) if cfg else max(t.features.shape[0] for t in traces)
    feats, hidden, conf, block, pos, rnd, L, K = [], [], [], [], [], [], [], []
    has_hidden = all(t.hidden is not None for t in traces)
    for b, t in enumerate(traces):
        g = t.features.shape[0]
        assert t.features.shape == (g, len(FEATURE_NAMES)), t.features.shape
        assert t.confidence.shape == (g,), t.confidence.shape
        if g > gamma:
            raise ValueError(f"{task_id}: a block of {g} positions exceeds gamma = {gamma}")
        feats.append(np.asarray(t.features, np.float32))
        conf.append(np.asarray(t.confidence, np.float32))
        if has_hidden:
            h = np.asarray(t.hidden, np.float32)
            assert h.ndim == 2 and h.shape[0] == g, h.shape
            hidden.append(h)
        block.append(np.full(g, b, np.int32))
        pos.append(np.arange(1, g + 1, dtype=np.int32))
        rnd.append(np.full(g, t.round, np.int32))
        L.append(np.full(g, -1 if t.L is None else t.L, np.int32))
        K.append(np.full(g, t.K, np.int32))
    tensors = {
        "features": np.concatenate(feats),
        "confidence": np.concatenate(conf),
        "block": np.concatenate(block),
        "position": np.concatenate(pos),
        "round": np.concatenate(rnd),
        "L": np.concatenate(L),
        "K": np.concatenate(K),
    }
    n_clipped = 0
    d_model = 0
    if has_hidden:
        h = np.concatenate(hidden)
        d_model = h.shape[1]
        big = np.abs(h) > _F16_MAX
        n_clipped = int(big.sum())
        tensors["hidden"] = np.clip(h, -_F16_MAX, _F16_MAX).astype(np.float16)
    meta = {
        "format": FORMAT,
        "task_id": str(task_id),
        "gamma": str(gamma),
        "d_model": str(d_model),
        "n_blocks": str(len(traces)),
        "feature_names": json.dumps(list(FEATURE_NAMES)),
        "hidden_clipped": str(n_clipped),
    }
    path = trace_path(run_dir, task_id)
    own_dir(path.parent)
    write_atomic(path, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return path


# ----------------------------------------------------------------------------- reading


def natural_key(task_id: str) -> tuple:
    """Sort key giving the benchmarks' own order: digit runs compare as integers, so
    ``HumanEval/2`` precedes ``HumanEval/10``."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", str(task_id)) if p)


def natural_sorted(ids: Iterable[str]) -> list[str]:
    return sorted((str(i) for i in ids), key=natural_key)


@dataclass
class TraceSet:
    """Full-length blocks of one or more trace runs, one row per block.

    prompt_ids:  distinct prompt ids in natural order; ``prompt`` indexes them
    features:    float32 [B, gamma, 19]
    hidden:      float16 [B, gamma, d] or None (not loaded, or not traced)
    confidence:  float32 [B, gamma]    raw confidence
    L, K:        int64   [B]           strict accepted length, committed skip length
    prompt:      int64   [B]           index into ``prompt_ids``
    round:       int64   [B]           decoding round of the block
    """

    gamma: int
    prompt_ids: list[str]
    features: np.ndarray
    hidden: np.ndarray | None
    confidence: np.ndarray
    L: np.ndarray
    K: np.ndarray
    prompt: np.ndarray
    round: np.ndarray
    runs: tuple[str, ...] = ()
    policies: tuple[str | None, ...] = ()
    dropped_short: int = 0
    dropped_unknown_L: int = 0
    feature_names: tuple[str, ...] = field(default=FEATURE_NAMES)

    def __post_init__(self):
        B, g = self.n_blocks, self.gamma
        assert self.features.shape == (B, g, len(self.feature_names)), self.features.shape
        assert self.confidence.shape == (B, g), self.confidence.shape
        assert self.L.shape == self.K.shape == self.prompt.shape == self.round.shape == (B,)
        if self.hidden is not None:
            assert self.hidden.shape[:2] == (B, g), self.hidden.shape
        assert np.all((self.L >= 0) & (self.L <= g)), "L must lie in [0, gamma]"

    @property
    def n_blocks(self) -> int:
        return int(self.L.shape[0])

    @property
    def d_model(self) -> int:
        return 0 if self.hidden is None else int(self.hidden.shape[2])

    def blocks_of(self, ids: Iterable[str]) -> np.ndarray:
        """Boolean [B]: the blocks of the given prompts."""
        wanted = set(map(str, ids))
        keep = np.array([p in wanted for p in self.prompt_ids], dtype=bool)
        return keep[self.prompt] if self.n_blocks else np.zeros(0, bool)


def trace_files(run_dir: str | Path) -> list[Path]:
    d = Path(run_dir) / TRACE_DIR
    return sorted(d.glob("*.safetensors")) if d.is_dir() else []


def _finished(run_dir: Path) -> set[str] | None:
    """Prompt ids recorded in ``samples.jsonl`` (None without one)."""
    p = run_dir / SAMPLES
    if not p.exists():
        return None
    ids = set()
    for row in read_jsonl(p, partial=True):
        if "task_id" not in row:
            break
        ids.add(row["task_id"])
    return ids


def load_traces(run_dirs: str | Path | Sequence[str | Path], hidden: bool = True, gamma: int | None = None) -> TraceSet:
    """Load the full-length, labelled blocks of one or more ``--trace`` run directories.

    A run with a ``samples.jsonl`` contributes only the prompts it records as finished. Blocks
    shorter than ``gamma`` (the run's block length; all runs must agree) and blocks whose ``L`` is
    unknown (skipped rounds without the shadow verifier) are dropped and counted. ``hidden=False``
    leaves the hidden states on disk (raw-confidence diagnostics need none).
    """
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    if not run_dirs:
        raise ValueError("no trace run directories given")
    per_prompt, policies, gammas = _read_trace_runs(run_dirs, hidden)
    if gamma is None:
        if len(gammas) != 1:
            raise ValueError(f"trace runs disagree on gamma ({sorted(gammas)}); give runs of one block length")
        gamma = gammas.pop()
    if not per_prompt:
        raise ValueError("the trace runs hold no finished prompt")
    if hidden:
        with_h = {tid for tid, r in per_prompt.items() if r["has_hidden"]}
        if with_h and len(with_h) != len(per_prompt):
            raise ValueError("some trace files have hidden states and others not; load with hidden=False")
        hidden = bool(with_h)
    return _assemble(per_prompt, gamma, hidden, tuple(str(r) for r in run_dirs), tuple(policies))


def _read_trace_runs(run_dirs, hidden: bool) -> tuple[dict[str, dict], list, set]:
    """Per prompt, the arrays of its trace file (finished prompts only); the runs' policies and
    block lengths."""
    from safetensors import safe_open

    per_prompt: dict[str, dict] = {}
    policies, gammas = [], set()
    for rd in map(Path, run_dirs):
        check_input_dir(rd, "trace run directory")
        files = trace_files(rd)
        if not files:
            raise ValueError(f"{rd} holds no block traces (decode with `vskip run ... --trace`)")
        cfg = _run_config(rd)
        policies.append(cfg["policy"]["name"] if cfg else None)
        if cfg:
            gammas.add(int(cfg["decode"]["gamma"]))
        finished = _finished(rd)
        for f in files:
            with safe_open(str(f), framework="numpy") as sf:
                meta = sf.metadata() or {}
                if meta.get("format") != FORMAT:
                    raise ValueError(f"{f} is not a vskip trace file")
                tid = meta["task_id"]
                if finished is not None and tid not in finished:
                    continue
                if tid in per_prompt:
                    raise ValueError(f"prompt {tid} appears in two trace runs ({per_prompt[tid]['run']} and {rd})")
                if not cfg:
                    gammas.add(int(meta["gamma"]))
                names = set(sf.keys())
                rec = {k: sf.get_tensor(k) for k in ("features", "confidence", "block", "position", "round", "L", "K")}
                rec["hidden"] = sf.get_tensor("hidden") if hidden and "hidden" in names else None
                rec["has_hidden"] = "hidden" in names
                rec["run"] = str(rd)
                per_prompt[tid] = rec
    return per_prompt, policies, gammas


def _assemble(per_prompt: dict[str, dict], gamma: int, hidden: bool, runs: tuple, policies: tuple) -> TraceSet:
    """The full-length, labelled blocks of every prompt, stacked, with the dropped counts."""
    ids = natural_sorted(per_prompt)
    F, H, C, L, K, P, R = [], [], [], [], [], [], []
    short = unknown = 0
    d_model = None
    for i, tid in enumerate(ids):
        rec = per_prompt[tid]
        blk = rec["block"].astype(np.int64)
        nb = int(blk.max()) + 1 if blk.size else 0
        lengths = np.bincount(blk, minlength=nb)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        full = lengths == gamma
        short += int((~full).sum())
        Lb = rec["L"][starts].astype(np.int64)
        ok = full & (Lb >= 0)
        unknown += int((full & (Lb < 0)).sum())
        if not ok.any():
            continue
        rows = (starts[ok][:, None] + np.arange(gamma)[None, :])  # [b, gamma] position rows
        assert np.all(rec["position"][rows] == np.arange(1, gamma + 1)), f"{tid}: positions out of order"
        F.append(rec["features"][rows])
        C.append(rec["confidence"][rows])
        if hidden:
            h = rec["hidden"][rows]
            if d_model is not None and h.shape[2] != d_model:
                raise ValueError(f"trace runs disagree on d_model ({d_model} vs {h.shape[2]})")
            d_model = h.shape[2]
            H.append(h)
        L.append(Lb[ok])
        K.append(rec["K"][starts][ok].astype(np.int64))
        R.append(rec["round"][starts][ok].astype(np.int64))
        P.append(np.full(int(ok.sum()), i, np.int64))
    nf = len(FEATURE_NAMES)
    cat = lambda xs, shape, dt: np.concatenate(xs) if xs else np.zeros(shape, dt)  # noqa: E731
    return TraceSet(
        gamma=gamma, prompt_ids=ids, features=cat(F, (0, gamma, nf), np.float32),
        hidden=cat(H, (0, gamma, d_model or 0), np.float16) if hidden else None,
        confidence=cat(C, (0, gamma), np.float32), L=cat(L, (0,), np.int64), K=cat(K, (0,), np.int64),
        prompt=cat(P, (0,), np.int64), round=cat(R, (0,), np.int64), runs=runs, policies=policies,
        dropped_short=short, dropped_unknown_L=unknown,
    )


# ----------------------------------------------------------------------------- folds (A.7)


def folds(prompt_ids: Iterable[str], seed: int = FOLD_SEED, k: int = N_FOLDS) -> list[tuple[str, ...]]:
    """The ``k`` folds of A.7: the prompt ids, sorted in natural benchmark order
    (:func:`natural_key`), are shuffled by ``numpy.random.RandomState(seed).permutation`` and the
    shuffled list is cut into ``k`` consecutive parts with ``numpy.array_split`` (sizes differ by
    at most one; 164 HumanEval prompts give 33, 33, 33, 33, 32)."""
    ids = natural_sorted(set(map(str, prompt_ids)))
    if k < 3:
        raise ValueError(f"the fold protocol needs k >= 3 folds, got {k}")
    if len(ids) < k:
        raise ValueError(f"{len(ids)} prompts cannot fill {k} folds; trace at least {k} prompts")
    order = np.random.RandomState(seed).permutation(len(ids))
    shuffled = [ids[i] for i in order]
    return [tuple(part) for part in np.array_split(np.asarray(shuffled, dtype=object), k)]


# ----------------------------------------------------------------------------- labels (§4.2)


def survival_labels(kind: str, L: np.ndarray, gamma: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-position targets of a survival predictor; returns ``(y, mask)``, both [B, gamma].

    marginal:    ``y_j = 1{L >= j}`` on every position of every block;
    conditional: the at-risk set ``L >= j - 1``: ``y_j = 1`` for ``j <= L``, ``y_j = 0`` at
                 ``j = L + 1`` (when ``L < gamma``), later positions masked out.

    Example, gamma = 4, L = 2: marginal y = [1, 1, 0, 0], all kept; conditional y = [1, 1, 0, ·],
    mask = [1, 1, 1, 0].
    """
    L = np.asarray(L, np.int64)
    j = np.arange(1, gamma + 1)[None, :]
    y = (L[:, None] >= j).astype(np.float32)
    if kind == "marginal":
        mask = np.ones_like(y, dtype=bool)
    elif kind == "conditional":
        mask = L[:, None] >= j - 1
    else:
        raise ValueError(f"unknown predictor kind {kind!r}; expected marginal or conditional")
    return y, mask
