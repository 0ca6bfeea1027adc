"""Training the conditioned drafter (:mod:`vskip.engine.models.conditioned`) on the verifier's hidden
states over its own greedy answers (:mod:`vskip.distill.taps`).

A training block picks an anchor ``a`` inside an answer (the last committed token) and an
unverified tail of ``u`` tokens before it: the context is the verifier's features at positions
``0 .. a - u - 1``, the query is ``row[a - u .. a]`` followed by ``block_size - 1`` masks, and the
targets are ``row[a + 1 ..]``, the verifier's greedy tokens. Half of the blocks have no tail (the
verifier ran over everything before the anchor, as after every verified round); the others draw
``u`` log-uniformly from 1 to ``max_tail``, as after skips. Each row's context keys/values are
computed once and every block of that row attends to its own prefix of them and to itself. The
loss is the cross-entropy at the mask positions, weighted ``exp(-(k - 1) / loss_decay)`` by block
position ``k`` (the early positions decide the accepted prefix).

Evaluation is exact and offline: the stored answers are the verifier's greedy output, so a
block's Strict SDD accepted length is the longest drafted prefix equal to them. It reports the
first-position acceptance, tokens per verifier call at random anchors per tail length, and the
decode path (the first ``replay_tokens`` tokens of held-out answers decoded again, each block
anchored behind the last rejection).
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

from ..engine.models.backbone import BackboneConfig, read_hf_config
from ..engine.models.conditioned import ConditionedLM, ConditionedSpec
from .config import ConditionedTrainConfig
from .rows import Data, head_vocabulary, load_rows, outside_head, split
from .train import lr_at, state_tensors

STATE_FILE = "train_state.safetensors"
#: tail lengths the evaluation reports
EVAL_TAILS = (0, 1, 2, 4, 8, 16)


def build_model(verifier_dir: Path, layers: tuple[int, ...], cfg: ConditionedTrainConfig,
                head_ids: torch.Tensor | None) -> ConditionedLM:
    """A conditioned drafter for the verifier in ``verifier_dir``, its draft layers started from
    the verifier's top layers, the fusion started as the last tapped layer's features, the
    embedding (and tied head) shared."""
    from ..engine.models.drafter_io import backbone_state_from_hf

    hf = read_hf_config(verifier_dir)
    n = int(hf["num_hidden_layers"])
    bb = BackboneConfig.from_hf(hf, num_layers=cfg.num_layers)
    spec = ConditionedSpec(backbone=bb, target_layers=layers, block_size=cfg.block_size, mask_token_id=None,
                           qk_norm=False, max_tail=cfg.max_tail)
    model = ConditionedLM(spec, head_ids)
    top = tuple(range(n - cfg.num_layers, n))
    sd = backbone_state_from_hf(verifier_dir, cfg.num_layers, top)
    emb = sd.pop("embed_tokens.weight")
    head = sd.pop("lm_head.weight", None)
    own = {k: v for k, v in sd.items() if k.startswith("layers.") or k == "norm.weight"}
    missing, unexpected = model.load_state_dict(own, strict=False)
    assert not unexpected, unexpected
    d = bb.hidden_size
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.weight[:, (len(layers) - 1) * d:] = torch.eye(d)
        model.hidden_norm.weight.copy_(sd["layers.0.input_layernorm.weight"])
        model.mask_embedding.copy_(emb.mean(0))
    return model.attach(emb, head)


def trainable(model: ConditionedLM) -> dict[str, torch.nn.Parameter]:
    return dict(model.named_parameters())


def _tail(rng, cfg: ConditionedTrainConfig, a: int) -> int:
    if cfg.max_tail == 0 or rng.random() < cfg.no_tail_share:
        return 0
    u = int(math.exp(rng.uniform(0.0, math.log(cfg.max_tail + 1))))
    return max(0, min(u, cfg.max_tail, a - 1))


def pack_row(row: np.ndarray, P: int, n_feats: int, rng, cfg: ConditionedTrainConfig, mask_id: int) -> dict:
    """``blocks_per_seq`` blocks of one row in one query: ``ids``/``pos`` [T] (every block's tail
    and masks), ``C`` (context positions with features), ``mask`` [1, 1, T, C + T] (a block sees
    the context before its tail and itself), and per target the query row, the token and the
    weight ``exp(-(k - 1) / loss_decay)``."""
    N, nm = min(len(row), n_feats), cfg.block_size - 1
    anchors = rng.integers(P - 1, N - 1, cfg.blocks_per_seq)  # the first target a + 1 lies in the answer
    ms = [int(a) - _tail(rng, cfg, int(a)) for a in anchors]
    C = max(ms)
    ids, pos, spans = [], [], []
    for a, m in zip(anchors, ms):
        q = [int(t) for t in row[m : int(a) + 1]] + [mask_id] * nm
        spans.append((len(ids), len(q), m, int(a)))
        ids += q
        pos += list(range(m, int(a) + 1 + nm))
    T = len(ids)
    mask = torch.zeros(1, 1, T, C + T, dtype=torch.bool)
    rows_t, tgt, w = [], [], []
    for s, L, m, a in spans:
        mask[0, 0, s : s + L, :m] = True
        mask[0, 0, s : s + L, C + s : C + s + L] = True
        for k in range(1, min(nm, N - 1 - a) + 1):
            rows_t.append(s + L - nm + k - 1)
            tgt.append(int(row[a + k]))
            w.append(math.exp(-(k - 1) / cfg.loss_decay))
    return {"ids": torch.tensor([ids]), "pos": torch.tensor(pos), "C": C, "mask": mask, "spans": spans,
            "rows": torch.tensor(rows_t, dtype=torch.long), "targets": torch.tensor(tgt, dtype=torch.long),
            "weights": torch.tensor(w)}


def row_loss(model: ConditionedLM, row: np.ndarray, P: int, feats: torch.Tensor, rng, cfg: ConditionedTrainConfig,
             head_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of weighted cross-entropies, sum of weights) over ``blocks_per_seq`` blocks of one row."""
    dev = model.fc.weight.device
    b = {k: v.to(dev) if isinstance(v, torch.Tensor) else v
         for k, v in pack_row(row, P, feats.shape[0], rng, cfg, model.mask_id).items()}
    ctx = model.context(feats[: b["C"]][None].to(dev), torch.arange(b["C"], device=dev))
    h = model(b["ids"], b["pos"], ctx, b["mask"])[0]
    logits = h[b["rows"]] @ model.head_weight().T
    t = head_index[b["targets"]]
    keep = t >= 0
    ce = F.cross_entropy(logits.float()[keep], t[keep], reduction="none")
    return (ce * b["weights"][keep]).sum(), b["weights"][keep].sum()


@torch.inference_mode()
def draft(model: ConditionedLM, row: np.ndarray, feats: torch.Tensor, a: int, u: int, W: torch.Tensor,
          ids: torch.Tensor) -> np.ndarray:
    """The greedy draft (block_size - 1 tokens) after anchor ``a`` with a tail of ``u`` tokens."""
    nm, m, dev = model.spec.block_size - 1, a - u, model.fc.weight.device
    ctx = model.context(feats[:m][None].to(dev), torch.arange(m, device=dev)) if m > 0 else None
    q = torch.tensor([list(row[m : a + 1]) + [model.mask_id] * nm], device=dev)
    h = model(q, torch.arange(m, a + 1 + nm, device=dev), ctx)[0, -nm:]
    return ids[(h @ W.T).argmax(-1)].cpu().numpy()


def accepted(drafted: np.ndarray, row: np.ndarray, a: int) -> int:
    truth = row[a + 1 : a + 1 + len(drafted)]
    n = 0
    while n < len(truth) and drafted[n] == truth[n]:
        n += 1
    return n


def evaluate(model: ConditionedLM, ho: Data, feats: dict[int, torch.Tensor], ho_index: list[int],
             cfg: ConditionedTrainConfig, scale: int = 1) -> dict:
    """Held-out figures: per tail length, P(L >= 1), mean L and tokens per call at random anchors;
    and the decode path's tokens per call."""
    model.eval()
    W, ids = model.head_weight(), model.head_token_ids()
    rng = np.random.default_rng([cfg.seed, 7])
    out = {"tails": {}}
    nm = model.spec.block_size - 1
    for u in EVAL_TAILS:
        Ls, hits, seen = [], np.zeros(nm), np.zeros(nm)
        for _ in range(cfg.eval_blocks * scale):
            j = int(rng.integers(len(ho)))
            row, P, f = ho.rows[j], ho.prompt_lens[j], feats[ho_index[j]]
            N = min(len(row), f.shape[0])
            a = int(rng.integers(max(P - 1, u + 1), N - 1)) if N - 1 > max(P - 1, u + 1) else None
            if a is None:
                continue
            d = draft(model, row, f, a, u, W, ids)
            truth = np.asarray(row[a + 1 : a + 1 + nm])
            hits[: len(truth)] += d[: len(truth)] == truth
            seen[: len(truth)] += 1
            Ls.append(accepted(d, row, a))
        if u == 0:  # each block position on its own, whatever came before it
            out["position_top1"] = [round(float(h / max(s, 1)), 4) for h, s in zip(hits, seen)]
        L = np.asarray(Ls, dtype=float)
        out["tails"][str(u)] = {"blocks": len(L), "p_L_ge_1": float((L >= 1).mean()),
                                "p_L_ge_1_ci95": _wilson(int((L >= 1).sum()), len(L)), "mean_L": float(L.mean()),
                                "tokens_per_call": float(L.mean() + 1)}
    out["first_step_top1"] = out["tails"]["0"]["p_L_ge_1"]
    if cfg.replay_answers:
        out["replay"] = replay(model, ho, feats, ho_index, cfg.replay_answers * scale, cfg.replay_tokens, W, ids)
    model.train()
    return out


def _wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson interval of a share k/n."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    mid, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return [max(0.0, round((mid - half) / (1 + z * z / n), 4)), min(1.0, round((mid + half) / (1 + z * z / n), 4))]


def replay(model, ho: Data, feats, ho_index, answers: int, tokens: int, W, ids) -> dict:
    """Strict SDD on the first ``tokens`` answer tokens of ``answers`` held-out answers, block by
    block: the verifier's features reach the anchor, a block accepts L and adds the bonus."""
    calls = made = first = 0
    for j in range(min(answers, len(ho))):
        row, P, f = ho.rows[j], ho.prompt_lens[j], feats[ho_index[j]]
        end = min(len(row), f.shape[0], P + tokens)
        a = P - 1
        while a < end - 1:
            L = accepted(draft(model, row, f, a, 0, W, ids), row, a)
            calls, made, first = calls + 1, made + min(L + 1, end - 1 - a), first + (L >= 1)
            a += L + 1
    return {"answers": min(answers, len(ho)), "calls": calls, "tokens_per_call": made / max(calls, 1),
            "p_L_ge_1": first / max(calls, 1)}


def _index(data_dir: Path) -> dict:
    """The data set's ``index.json`` (empty where a data directory has none)."""
    path = Path(data_dir) / "index.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_state(out: Path, model: ConditionedLM, opt, step: int, cfg: ConditionedTrainConfig, log: list) -> None:
    from safetensors.torch import save_file

    from ..files import write_atomic, write_json

    tensors = state_tensors(trainable(model), opt)
    tensors["head_ids"] = model.head_ids.cpu().contiguous()
    meta = {"step": step, "config": asdict(cfg), "layers": list(model.spec.target_layers), "log": log}
    write_atomic(out / STATE_FILE, lambda tmp: save_file(tensors, tmp, metadata={"state": json.dumps(meta)}))
    write_json(out / "train_state.json", meta, indent=None)


def read_state(out: Path) -> tuple[dict, dict]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(Path(out) / STATE_FILE), framework="pt") as f:
        meta = json.loads((f.metadata() or {})["state"])
    return meta, load_file(str(Path(out) / STATE_FILE))


def load_state(model: ConditionedLM, tensors: dict, opt=None, step: int = 0) -> None:
    with torch.no_grad():
        for n, p in trainable(model).items():
            p.copy_(tensors[f"param.{n}"])
            if opt is not None and f"adam.exp_avg.{n}" in tensors:
                opt.state[p] = {"step": torch.tensor(float(step)), "exp_avg": tensors[f"adam.exp_avg.{n}"].to(p.device),
                                "exp_avg_sq": tensors[f"adam.exp_avg_sq.{n}"].to(p.device)}


def train(data_dir: Path, features_dir: Path, out: Path, verifier_dir: Path, cfg: ConditionedTrainConfig,
          progress: bool = True, until: float | None = None, device: str = "cpu") -> Path:
    """Train (or resume) a conditioned drafter on the features in ``features_dir``; ``until`` (a
    ``time.time()``) stops early at a checkpoint. ``device``: where the drafter trains (the
    features stay on the host and travel row by row; checkpoints are the same on any device, so a
    run may resume elsewhere). Writes ``out/drafter`` at the end."""
    from tqdm import tqdm

    from ..engine.runtime import Runtime
    from ..files import own_dir, write_json
    from .taps import load_taps, read_index, summary

    out = own_dir(out)
    Runtime(threads=cfg.threads).activate()
    torch.manual_seed(cfg.seed)
    data = load_rows(Path(data_dir))
    taps = load_taps(Path(features_dir))
    tr_idx = [i for i in taps.rows() if i not in set(taps.holdout)]
    ho_idx = [i for i in taps.holdout if i in taps.features]
    if not tr_idx or not ho_idx:
        raise ValueError(f"{features_dir} holds no training rows or no held-out rows; extract more (vskip extract-features)")
    if sorted(split(data, cfg.holdout, cfg.seed)[1].prompt_ids) != sorted(data.prompt_ids[i] for i in taps.holdout):
        raise ValueError(f"{features_dir} was extracted with another held-out split (--holdout/--seed)")
    pick = lambda idx: Data(*[[x[i] for i in idx] for x in (data.rows, data.prompt_lens, data.prompt_ids)])  # noqa: E731
    tr, ho = pick(tr_idx), pick(ho_idx)
    resume = (out / STATE_FILE).exists()
    meta, tensors = read_state(out) if resume else ({}, {})
    head = tensors["head_ids"] if resume else head_vocabulary(tr, int(_index(data_dir).get("eos_id", 2)))
    model = build_model(verifier_dir, taps.layers, cfg, head).to(device)
    head_index = torch.full((model.spec.backbone.vocab_size,), -100, dtype=torch.long)
    head_index[head] = torch.arange(len(head))
    head_index = head_index.to(device)
    opt = torch.optim.AdamW(trainable(model).values(), lr=cfg.lr, weight_decay=0.0)
    step, log = (int(meta["step"]), meta["log"]) if resume else (0, [])
    if resume:
        load_state(model, tensors, opt, step)
    write_json(out / "config.json", {"train": asdict(cfg), "data": str(data_dir), "features": str(features_dir),
                                     "features_summary": summary(read_index(Path(features_dir))),
                                     "rows": len(tr), "holdout_rows": len(ho), "head_size": len(head),
                                     "holdout_outside_head": outside_head(ho, head), "layers": list(taps.layers)})
    bar = tqdm(total=cfg.steps, initial=step, desc="train conditioned drafter", unit="step", disable=not progress)
    t0 = time.time()
    seconds_before = float(log[-1]["seconds"]) if log else 0.0
    targets = int(log[-1].get("targets", 0)) if log else 0
    if not log:
        log.append({"step": 0, "targets": 0, "seconds": 0.0, **evaluate(model, ho, taps.features, ho_idx, cfg)})
    model.train()
    while step < cfg.steps and (until is None or time.time() < until):
        rng = np.random.default_rng([cfg.seed, step])
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, cfg)
        total, weight = 0.0, 0.0
        for j in rng.integers(0, len(tr), cfg.batch_seqs):
            s, w = row_loss(model, tr.rows[j], tr.prompt_lens[j], taps.features[tr_idx[j]], rng, cfg, head_index)
            total, weight = total + s, weight + w
        loss = total / weight
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable(model).values(), 1.0)
        opt.step()
        step += 1
        targets += int(cfg.batch_seqs * cfg.blocks_per_seq * (cfg.block_size - 1))
        entry = {"step": step, "loss": float(loss.detach()), "targets": targets,
                 "seconds": seconds_before + time.time() - t0}
        bar.update(1)
        bar.set_postfix(loss=f"{entry['loss']:.3f}")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            entry |= evaluate(model, ho, taps.features, ho_idx, cfg)
            entry["seconds"] = seconds_before + time.time() - t0
            bar.write(f"step {step}: loss {entry['loss']:.3f}, P(L>=1) {entry['first_step_top1']:.3f}, "
                      f"decode path {entry['replay']['tokens_per_call']:.2f} tokens/call" if "replay" in entry else "")
            write_curve(log + [entry], out)
        log.append(entry)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            save_state(out, model, opt, step, cfg, log)
    bar.close()
    save_state(out, model, opt, step, cfg, log)
    return out


def write_curve(log: list[dict], out: Path) -> Path | None:
    """``curve.csv`` and ``curve.png``: held-out P(L >= 1) (no tail) and tokens per call on the
    decode path against the answer tokens trained on."""
    from ..files import save_figure, write_csv

    rows = [(e["targets"], e["step"], e["first_step_top1"], e.get("replay", {}).get("tokens_per_call"))
            for e in log if "first_step_top1" in e]
    if not rows:
        return None
    write_csv(Path(out) / "curve.csv", ["targets", "step", "p_L_ge_1", "decode_path_tokens_per_call"], rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    x = [r[0] / 1e6 for r in rows]
    ax[0].plot(x, [r[2] for r in rows], marker="o")
    ax[0].set(xlabel="answer tokens trained on (millions)", ylabel="held-out P(L >= 1), random anchors")
    ax[1].plot(x, [r[3] for r in rows], marker="s", color="C2")
    ax[1].set(xlabel="answer tokens trained on (millions)", ylabel="held-out tokens per call, decode path")
    for a in ax:
        a.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, Path(out) / "curve.png")
    plt.close(fig)
    return Path(out) / "curve.png"


def export(out: Path, data_dir: Path, features_dir: Path, verifier_dir: Path, final_eval: bool = True) -> Path:
    """``out/drafter``: the latest checkpoint's weights (fp16, never the verifier's embedding or
    head), its spec, and ``manifest.json`` (the verifier's hashes, the layout, the data and
    features it was made from with the extraction's time and size, the training's steps and time,
    the held-out figures, and the weights' sha256)."""
    from ..engine.models.conditioned_io import save_conditioned
    from ..files import file_sha256, write_json
    from .generate import _verifier_hashes
    from .shards import data_fingerprint
    from .taps import load_taps, read_index, summary

    out = Path(out)
    meta, tensors = read_state(out)
    cfg = ConditionedTrainConfig(**meta["config"])
    model = build_model(verifier_dir, tuple(meta["layers"]), cfg, tensors["head_ids"])
    load_state(model, tensors)
    log = meta.get("log") or []
    holdout = None
    if final_eval:
        data = load_rows(Path(data_dir))
        taps = load_taps(Path(features_dir), max_chunks=1)  # chunk 0: the held-out rows
        ho_idx = [i for i in taps.holdout if i in taps.features]
        ho = Data(*[[x[i] for i in ho_idx] for x in (data.rows, data.prompt_lens, data.prompt_ids)])
        holdout = evaluate(model, ho, taps.features, ho_idx, cfg, scale=4)
    feats = summary(read_index(Path(features_dir)))
    info = {"train": asdict(cfg), "steps": int(meta["step"]), "head_size": int(len(tensors["head_ids"])),
            "train_seconds": log[-1].get("seconds") if log else None, "features": feats, "holdout": holdout}
    ddir = save_conditioned(model.eval(), out / "drafter", meta=info)
    weights = ddir / "drafter.safetensors"
    index = _index(data_dir)
    write_json(ddir / "manifest.json", {
        "format": "vskip-drafter-manifest/1",
        "verifier": _verifier_hashes(Path(verifier_dir)),
        "layout": {k: v for k, v in model.spec.to_json().items() if k != "meta"} | {"head_size": info["head_size"]},
        "data": {"prompts_sha256": index.get("prompts_sha256"), "max_new_tokens": index.get("max_new_tokens"),
                 "files": data_fingerprint(Path(data_dir)), "rows_with_features": feats["rows"]},
        "features": {"extraction_seconds": feats["seconds"], "bytes": feats["bytes"], "tokens": feats["tokens"],
                     "dtype": "bfloat16", "layers": list(meta["layers"])},
        "train": info["train"], "steps": info["steps"], "train_seconds": info["train_seconds"], "holdout": holdout,
        "weights": {"file": weights.name, "bytes": weights.stat().st_size, "sha256": file_sha256(weights)},
    })
    write_curve(log, out)
    return ddir
