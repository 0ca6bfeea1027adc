"""Training the self-distilled diffusion drafter on the verifier's own greedy answers.

Each training sequence is one stored row (chat prompt + the verifier's greedy answer). From it we
draw ``blocks_per_seq`` block starts ``b`` inside the answer and pack, in one forward pass,

    [ x_0 .. x_{C-1} ]  [ x_{b1-1}, m, m, ..., m ]  [ x_{b2-1}, m, ..., m ]  ...
      causal context      query block 1 (gamma+1)   query block 2

where a query block attends to the context before it (``x_0 .. x_{b-2}``) and bidirectionally to
itself, exactly as the drafter runs at inference with its causally cached context. Some block
positions are revealed (ground truth) so the later denoising steps are trained too; the loss is the
cross-entropy of the masked positions against the verifier's greedy tokens (logits shifted by one,
over the restricted output head).

Checkpoints are safetensors (parameters and Adam state) plus JSON; a killed run resumes from the
last checkpoint.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..engine.models.copy import copy_hint
from ..engine.models.diffusion_lm import HINT_MAX_LEN, DiffusionLM, hint_code
from ..engine.models.drafter_io import drafter_from_verifier, save_drafter
from ..files import own_dir, save_figure, write_atomic
from .config import TrainConfig
from .offline import acceptance, replay
from .rows import Data, head_vocabulary, load_rows, outside_head, split
from .shards import data_fingerprint

STATE_FILE = "train_state.safetensors"
META_FILE = "train_state.json"


def make_batch(data: Data, rng: np.random.Generator, cfg: TrainConfig, mask_id: int, head_index: torch.Tensor):
    """Packed sequences, per-sample positions and masks, (row, column) targets, their loss
    weights, and the hint input (None unless ``cfg.copy_input``)."""
    g = cfg.gamma
    vocab_size = len(head_index)  # head_index maps every vocabulary id to its head column
    seqs, poss, masks, hints, tgt_pos, tgt_ids, tgt_j = [], [], [], [], [], [], []
    picks = rng.integers(0, len(data), cfg.batch_seqs)
    for bi, i in enumerate(picks):
        row, P = data.rows[i], data.prompt_lens[i]
        n = len(row)
        starts = rng.integers(P, n, cfg.blocks_per_seq)  # block starts inside the answer
        if cfg.early_share > 0:  # (no draw otherwise: older runs resume on the same batches)
            early = rng.random(cfg.blocks_per_seq) < cfg.early_share
            starts = np.where(early, rng.integers(P, min(n, P + cfg.early_tokens), cfg.blocks_per_seq), starts)
        # keep at most max_context context tokens: shift the window so the latest block fits
        lo = max(0, int(starts.max()) - 1 - cfg.max_context)
        starts = np.maximum(starts, lo + 1)
        C = int(starts.max()) - 1 - lo  # causal part: x_lo .. x_{max b - 2}
        toks = [row[lo : lo + C]]
        pos = [np.arange(lo, lo + C)]
        hint = [np.full(C, -1, dtype=np.int64)]
        S = C + len(starts) * (g + 1)
        m = np.zeros((S, S), dtype=bool)
        m[:C, :C] = np.tril(np.ones((C, C), dtype=bool))
        for k, b in enumerate(starts):
            r0 = C + k * (g + 1)
            q = np.full(g + 1, mask_id, dtype=np.int64)
            q[0] = row[b - 1]
            target = row[b : b + g]
            if rng.random() < cfg.full_mask_share:
                masked = np.ones(g, dtype=bool)
            else:
                masked = rng.random(g) < rng.random()
                if not masked.any():
                    masked[rng.integers(0, g)] = True
            reveal = ~masked[: len(target)]
            q[1 : 1 + len(target)][reveal] = target[reveal]
            toks.append(q)
            hint.append(_block_hint(row[:b], target, reveal, g, cfg.copy_input, vocab_size))
            pos.append(np.arange(b - 1, b + g))
            m[r0 : r0 + g + 1, : b - 1 - lo] = True
            m[r0 : r0 + g + 1, r0 : r0 + g + 1] = True
            for j in range(len(target)):
                if masked[j]:
                    tgt_pos.append((bi, r0 + j))  # hidden at query index j predicts target j
                    tgt_ids.append(int(target[j]))
                    tgt_j.append(j + 1)
        seqs.append(np.concatenate(toks))
        poss.append(np.concatenate(pos))
        hints.append(np.concatenate(hint))
        masks.append(m)
    S = max(len(s) for s in seqs)
    B = len(seqs)
    ids = torch.full((B, S), 0, dtype=torch.long)
    positions = torch.zeros((B, S), dtype=torch.long)
    hint_in = torch.full((B, S), -1, dtype=torch.long)
    mask = torch.zeros((B, 1, S, S), dtype=torch.bool)
    for b in range(B):
        L = len(seqs[b])
        ids[b, :L] = torch.from_numpy(seqs[b])
        hint_in[b, :L] = torch.from_numpy(hints[b])
        positions[b, :L] = torch.from_numpy(poss[b])
        mask[b, 0, :L, :L] = torch.from_numpy(masks[b])
        mask[b, 0, L:, :] = False
        mask[b, 0, torch.arange(L, S), torch.arange(L, S)] = True  # padding attends to itself
    tp = torch.tensor(tgt_pos, dtype=torch.long).reshape(-1, 2)
    tt = head_index[torch.tensor(tgt_ids, dtype=torch.long)]
    w = torch.tensor(tgt_j, dtype=torch.float32) ** -cfg.position_decay
    return ids, positions, mask, tp, tt, w, (hint_in if cfg.copy_input else None)


def _block_hint(context: np.ndarray, target: np.ndarray, reveal: np.ndarray, g: int, on: bool,
                vocab_size: int) -> np.ndarray:
    """The hint input of a training block's query ``[last token ; g positions]``: -1 at the last
    token, the copy hint's code at masked positions, dropped (-1) after the first revealed token
    that breaks it, exactly as the drafter does at inference."""
    out = np.full(g + 1, -1, dtype=np.int64)
    if not on:
        return out
    tokens, length = copy_hint(context, g, HINT_MAX_LEN)
    if length == 0:
        return out
    n = len(target)
    wrong = np.zeros(g, dtype=bool)
    wrong[:n] = reveal & (target != tokens[:n])
    keep = np.cumsum(wrong) - wrong == 0
    out[1:] = np.where(keep, hint_code(tokens, length, vocab_size), -1)
    return out


def trainable(model: DiffusionLM) -> dict[str, torch.nn.Parameter]:
    """Layers, final norm and the mask embedding; the embedding (and tied head) stays the verifier's."""
    return {n: p for n, p in model.named_parameters() if not n.startswith("backbone.embed_tokens")}


def lr_at(step: int, cfg) -> float:
    """Linear warm-up, then a cosine down to a tenth of ``cfg.lr`` at ``cfg.steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def state_tensors(params: dict, opt) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors: the parameters (``param.NAME``) and Adam's moments
    (``adam.exp_avg.NAME``, ``adam.exp_avg_sq.NAME``)."""
    tensors = {f"param.{n}": p.detach().float().cpu().contiguous() for n, p in params.items()}
    names = {id(p): n for n, p in params.items()}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            for k in ("exp_avg", "exp_avg_sq"):
                if k in st:
                    tensors[f"adam.{k}.{names[id(p)]}"] = st[k].cpu().contiguous()
    return tensors


def save_state(out: Path, model, opt, step: int, cfg: TrainConfig, log: list) -> None:
    from safetensors.torch import save_file

    tensors = state_tensors(trainable(model), opt)
    if model.head_ids is not None:
        tensors["head_ids"] = model.head_ids.contiguous()
    from ..files import write_atomic, write_json

    # the step and log ride inside the weights' file, written atomically with them: a run killed
    # between the two writes resumes from a consistent state (META_FILE is a readable copy)
    meta = {"step": step, "config": asdict(cfg), "log": log}
    write_atomic(out / STATE_FILE, lambda tmp: save_file(tensors, tmp, metadata={"state": json.dumps(meta)}))
    write_json(out / META_FILE, meta, indent=None)


def read_state_meta(out: Path) -> dict:
    """Step, configuration and log of a checkpoint: from inside its weights' file (older
    checkpoints: from ``train_state.json``)."""
    from safetensors import safe_open

    with safe_open(str(Path(out) / STATE_FILE), framework="pt") as f:
        inside = (f.metadata() or {}).get("state")
    return json.loads(inside) if inside else json.loads((Path(out) / META_FILE).read_text())


def _warm_start_source(src: Path, cfg: TrainConfig, data_dir: Path) -> dict:
    """What a run started from ``src`` (``cfg.init_from``) carries over: the first log entry (the
    source's answer targets, seconds and last held-out figures) and the provenance recorded in
    ``config.json``. Refuses a source of another layout, or one whose held-out split differs (its
    weights would have trained on rows this run holds out)."""
    if not (src / STATE_FILE).exists():
        raise FileNotFoundError(f"--init-from {src}: no {STATE_FILE} (not a drafter training directory)")
    meta = read_state_meta(src)
    theirs = TrainConfig(**{"copy_input": False, **meta["config"]})
    for key in ("num_layers", "layers", "copy_input", "holdout", "seed"):
        if getattr(theirs, key) != getattr(cfg, key):
            raise ValueError(f"--init-from {src}: its {key} is {getattr(theirs, key)!r}, this run's "
                             f"{getattr(cfg, key)!r}; they must agree")
    run = json.loads((src / "config.json").read_text()) if (src / "config.json").exists() else {}
    if run.get("data_files") and run["data_files"] != data_fingerprint(data_dir):
        raise ValueError(f"--init-from {src}: trained on other data files than {data_dir}, so its held-out "
                         "split is not this run's")
    log = meta.get("log") or []
    last = log[-1] if log else {}
    entry = {"step": 0, "init_from": str(src), "targets": int(last.get("targets", 0)),
             "seconds": float(last.get("seconds", 0.0))}
    from ..files import file_sha256

    info = {"dir": str(src), "step": int(meta["step"]), "state_sha256": file_sha256(src / STATE_FILE)}
    return {"entry": entry, "info": info}


def load_state(out: Path, model, opt) -> tuple[int, list]:
    """Parameters (and, unless ``opt`` is None, Adam's moments) from the checkpoint in ``out``."""
    from safetensors.torch import load_file

    t = load_file(str(out / STATE_FILE))
    meta = read_state_meta(out)
    params = trainable(model)
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(t[f"param.{n}"])
    if opt is None:
        return int(meta["step"]), meta.get("log", [])
    for n, p in params.items():
        if f"adam.exp_avg.{n}" in t:
            opt.state[p] = {
                "step": torch.tensor(float(meta["step"])),
                "exp_avg": t[f"adam.exp_avg.{n}"],
                "exp_avg_sq": t[f"adam.exp_avg_sq.{n}"],
            }
    return int(meta["step"]), meta.get("log", [])


def train(data_dir: Path, out: Path, verifier_dir: Path, cfg: TrainConfig, progress: bool = True,
          stop_at: int | None = None) -> Path | None:
    """Train (or resume) a drafter; writes checkpoints and, at the end, the shippable drafter
    directory ``out/drafter`` (only what differs from the verifier, fp16), which it returns.
    ``stop_at``: stop at this step of the schedule with a checkpoint, export nothing and return
    None (a rerun without it goes on with the same schedule)."""
    out = own_dir(out)
    from ..engine.runtime import Runtime

    Runtime(threads=cfg.threads).activate()
    torch.manual_seed(cfg.seed)
    data = load_rows(data_dir)
    tr, ho = split(data, cfg.holdout, cfg.seed)
    if not len(tr) or (cfg.holdout and not len(ho)):
        raise ValueError(f"{data_dir} holds {len(data)} usable rows: too few to train on and hold "
                         f"{cfg.holdout} out (a fifth of the rows at most is held out)")
    eos = 2
    index_path = Path(data_dir) / "index.json"
    if index_path.exists():
        eos = int(json.loads(index_path.read_text()).get("eos_id", eos))
    resume = (out / STATE_FILE).exists()
    source = None if resume or cfg.init_from is None else _warm_start_source(Path(cfg.init_from), cfg, data_dir)
    if resume or source:
        from safetensors.torch import load_file

        head = load_file(str((out if resume else Path(cfg.init_from)) / STATE_FILE))["head_ids"]
    else:
        head = head_vocabulary(tr, eos)  # from the training rows only: the held-out share outside it is honest
    model = drafter_from_verifier(verifier_dir, num_layers=cfg.num_layers, head_ids=head, layers=cfg.layers,
                                  copy_input=cfg.copy_input)
    V = model.spec.backbone.vocab_size
    head_index = torch.full((V,), -100, dtype=torch.long)
    head_index[head] = torch.arange(len(head))
    params = trainable(model)
    opt = torch.optim.AdamW(params.values(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    if resume:
        step, log = load_state(out, model, opt)
    else:
        step, log = 0, []
        if source:  # the source's weights, a fresh optimiser; the log starts from its totals and
            load_state(Path(cfg.init_from), model, None)  # with its figures under this run's evaluation
            log = [source["entry"] | _evaluate(model, ho, cfg)]
    run = json.loads((out / "config.json").read_text()) if resume and (out / "config.json").exists() else {}
    write_atomic(out / "config.json", json.dumps({"train": asdict(cfg), "data": str(data_dir),
                                                 "data_files": data_fingerprint(data_dir), "rows": len(tr),
                                                 "holdout_rows": len(ho), "head_size": len(head),
                                                 "holdout_outside_head": outside_head(ho, head),
                                                 "init_from": source["info"] if source else run.get("init_from")},
                                                indent=1))
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[cfg.dtype]
    model.train()
    step, log = _train_loop(model, opt, params, tr, ho, head_index, cfg, dtype, step, log, out, progress, stop_at)
    if step < cfg.steps:
        return None
    final = acceptance(model, ho, n_blocks=3 * cfg.eval_blocks)
    if cfg.replay_answers:
        final["replay"] = replay(model, ho, 2 * cfg.replay_answers, cfg.replay_tokens)
    meta = {"train": asdict(cfg), "steps": step, "holdout": final, "head_size": int(len(head)), "rows": len(tr),
            "train_seconds": log[-1].get("seconds") if log else None}
    save_drafter(model.eval(), out / "drafter", base_dir=verifier_dir, meta=meta)
    write_manifest(out / "drafter", out, data_dir, verifier_dir)
    write_curve(log, out)
    return out / "drafter"


def _step(model, opt, params, batch, dtype) -> tuple[torch.Tensor, int]:
    """One optimiser step on a batch of :func:`make_batch`: (weighted loss, targets trained on)."""
    ids, pos, mask, tp, tt, w, hint = batch
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        h, _ = model(ids, pos, None, mask, hint)
        logits = h[tp[:, 0], tp[:, 1]] @ model.head_weight().T
    keep = tt >= 0
    ce = F.cross_entropy(logits.float()[keep], tt[keep], reduction="none")
    loss = (ce * w[keep]).sum() / w[keep].sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
    opt.step()
    return loss, int(keep.sum())


def _evaluate(model, ho: Data, cfg: TrainConfig) -> dict:
    """A log entry's held-out figures: random block starts, and the decode path unless turned off."""
    out = {"holdout": acceptance(model, ho, n_blocks=cfg.eval_blocks)}
    if cfg.replay_answers:
        out["replay"] = replay(model, ho, cfg.replay_answers, cfg.replay_tokens)
    return out


def _train_loop(model, opt, params, tr, ho, head_index, cfg: TrainConfig, dtype, step: int, log: list, out: Path,
                progress: bool, stop_at: int | None = None) -> tuple[int, list]:
    """Steps from ``step`` to ``cfg.steps`` (or ``stop_at``), with held-out evaluations and checkpoints."""
    end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=step, desc="train drafter", unit="step", disable=not progress)
    t0, tokens_seen = time.time(), 0
    # answer tokens trained on so far (masked targets), carried over from the log on resume
    targets_seen = int(log[-1].get("targets", 0)) if log else 0
    # wall seconds spent training, summed over the parts of a resumed run (evaluations included)
    seconds_before = float(log[-1].get("seconds", 0.0)) if log else 0.0
    while step < end:
        # each step's batch depends on (seed, step) alone: a resumed run repeats the same steps
        rng = np.random.default_rng([cfg.seed, step])
        batch = make_batch(tr, rng, cfg, model.mask_id, head_index)
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, cfg)
        loss, n_targets = _step(model, opt, params, batch, dtype)
        step += 1
        tokens_seen += int(batch[0].numel())
        targets_seen += n_targets
        entry = {"step": step, "loss": float(loss.detach()), "tok_s": tokens_seen / (time.time() - t0),
                 "targets": targets_seen, "seconds": seconds_before + time.time() - t0}
        bar.update(1)
        bar.set_postfix(loss=f"{entry['loss']:.3f}", tok_s=f"{entry['tok_s']:.0f}")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            entry |= _evaluate(model, ho, cfg)
            entry["seconds"] = seconds_before + time.time() - t0
            bar.write(f"step {step}: loss {entry['loss']:.3f} holdout mean L {entry['holdout']['mean_L']:.2f}, "
                      f"first-step top-1 {entry['holdout']['first_step_top1']:.3f}"
                      + (f", decode path {entry['replay']['tokens_per_call']:.2f} tokens/call" if "replay" in entry
                         else ""))
        log.append(entry)
        if "holdout" in entry:  # the curve so far, readable while a long run goes on
            write_curve(log, out)
        if step % cfg.checkpoint_every == 0 or step == end:
            save_state(out, model, opt, step, cfg, log)
    bar.close()
    return step, log


def write_manifest(drafter_dir: Path, train_dir: Path, data_dir: Path, verifier_dir: Path,
                   shards: list[str] | None = None) -> dict:
    """``manifest.json`` beside a shippable drafter: the verifier it was distilled from, its layout,
    the data (prompt-file and shard hashes), the training settings and steps, and the held-out
    figures. The data files are those recorded when training started, else ``shards``, else all
    of ``data_dir``'s now."""
    from ..engine.models.embedded import file_sha256
    from .generate import _verifier_hashes

    drafter_dir, train_dir, data_dir = Path(drafter_dir), Path(train_dir), Path(data_dir)
    spec = json.loads((drafter_dir / "drafter.json").read_text())
    run = json.loads((train_dir / "config.json").read_text()) if (train_dir / "config.json").exists() else {}
    index = json.loads((data_dir / "index.json").read_text()) if (data_dir / "index.json").exists() else {}
    weights = drafter_dir / "drafter.safetensors"
    manifest = {
        "format": "vskip-drafter-manifest/1",
        # the same hashes the distillation data records: the dequantized weights and their source file
        "verifier": _verifier_hashes(Path(verifier_dir)),
        "layout": {k: spec[k] for k in ("backbone", "mask_token_id", "head", "attention", "reveal")}
                  | {"head_size": spec["meta"].get("head_size")},
        "data": {
            "prompts_sha256": index.get("prompts_sha256"),
            "max_new_tokens": index.get("max_new_tokens"),
            "files": run.get("data_files") or data_fingerprint(data_dir, shards),
            "train_rows": run.get("rows", spec["meta"].get("rows")),
            "holdout_rows": run.get("holdout_rows"),
        },
        "train": spec["meta"].get("train"),
        "steps": spec["meta"].get("steps"),
        "train_seconds": spec["meta"].get("train_seconds"),
        "holdout": spec["meta"].get("holdout"),
        "weights": {"file": weights.name, "bytes": weights.stat().st_size, "sha256": file_sha256(weights)},
    }
    write_atomic(drafter_dir / "manifest.json", json.dumps(manifest, indent=1))
    return manifest


def export(out: Path, verifier_dir: Path, evaluate_on: Path | None = None) -> Path:
    """Write the shippable drafter (``out/drafter``) from the latest checkpoint of a training run
    that may still be going."""
    from safetensors.torch import load_file

    out = Path(out)
    meta = read_state_meta(out)
    write_curve(meta.get("log") or [], out)
    cfg = TrainConfig(**{"copy_input": False, **meta["config"]})  # runs before the hint input had none
    head = load_file(str(out / STATE_FILE))["head_ids"]
    model = drafter_from_verifier(verifier_dir, num_layers=cfg.num_layers, head_ids=head, layers=cfg.layers,
                                  copy_input=cfg.copy_input)
    opt = torch.optim.AdamW(trainable(model).values())
    step, log = load_state(out, model, opt)
    info = {"train": asdict(cfg), "steps": step, "head_size": int(len(head)),
            "train_seconds": log[-1].get("seconds") if log else None}
    if evaluate_on is not None:
        _, ho = split(load_rows(evaluate_on), cfg.holdout, cfg.seed)
        info["holdout"] = acceptance(model, ho, n_blocks=3 * cfg.eval_blocks)
        if cfg.replay_answers:
            info["holdout"]["replay"] = replay(model, ho, 2 * cfg.replay_answers, cfg.replay_tokens)
    save_drafter(model.eval(), out / "drafter", base_dir=verifier_dir, meta=info)
    run = json.loads((out / "config.json").read_text()) if (out / "config.json").exists() else {}
    data_dir = evaluate_on or run.get("data")
    if data_dir and Path(data_dir).exists():
        write_manifest(out / "drafter", out, Path(data_dir), verifier_dir)
    return out / "drafter"


def write_curve(log: list[dict], out: Path) -> Path | None:
    """``curve.csv`` and ``curve.png`` in ``out``: held-out first-step top-1 agreement and tokens
    per verifier call (offline Strict SDD) against the answer tokens trained on, so one sees
    whether more data would still help. None when the log holds no evaluation."""
    rows = [(e.get("targets", 0), e["step"], e["holdout"]["first_step_top1"], e["holdout"]["tokens_per_call"],
             e["replay"]["tokens_per_call"] if "replay" in e else None)
            for e in log if "holdout" in e and "first_step_top1" in e["holdout"]]
    if not rows:
        return None
    out = Path(out)
    lines = ["targets,step,first_step_top1,tokens_per_call,decode_path_tokens_per_call"] + [
        f"{t},{s},{a:.4f},{c:.4f}," + ("" if r is None else f"{r:.4f}") for t, s, a, c, r in rows]
    from ..files import write_atomic

    write_atomic(out / "curve.csv", "\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    x = [r[0] / 1e6 for r in rows]
    ax[0].plot(x, [r[2] for r in rows], marker="o")
    ax[0].set(xlabel="answer tokens trained on (millions)", ylabel="held-out first-step top-1")
    ax[1].plot(x, [r[3] for r in rows], marker="o", color="C1", label="random starts, whole answer")
    path = [(xi, r[4]) for xi, r in zip(x, rows) if r[4] is not None]
    if path:
        ax[1].plot(*zip(*path), marker="s", color="C2", label="decode path, first answer tokens")
        ax[1].legend(fontsize=7)
    ax[1].set(xlabel="answer tokens trained on (millions)", ylabel="held-out tokens per verifier call")
    for a in ax:
        a.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, out / "curve.png")
    plt.close(fig)
    return out / "curve.png"
