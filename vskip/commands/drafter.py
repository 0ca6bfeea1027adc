"""The drafter's commands: ``vskip generate-data`` (the verifier's answers to the training prompts),
``vskip flag-leakage`` (training prompts too close to a benchmark's), ``vskip train-drafter`` and
``vskip fit-copy-prior``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .flags import add_threads_flag, add_verifier_flag, bounded


def register(subparsers) -> None:
    _generate_data(subparsers)
    f = subparsers.add_parser("flag-leakage", help="flag training prompts too close to a benchmark prompt",
                              description="Apply the leakage rules (vskip/distill/leakage.py) to the training "
                              "prompts of a distillation data directory and write its leakage.json, which training "
                              "and the copy prior's fit read.")
    f.add_argument("--data", required=True, help="distillation data directory (its prompts.jsonl, rebuilt if missing)")
    f.set_defaults(fn=cmd_flag_leakage)
    p = subparsers.add_parser(
        "train-drafter",
        help="generate self-distillation data and train the diffusion drafter (resumable)",
        description="Generate the verifier's greedy answers to the training prompts (with --generate) and "
        "train a Dream-style drafter from the verifier's first layers. Both stages resume after a kill.",
    )
    p.add_argument("--data", required=True, help="distillation data directory (shards)")
    p.add_argument("--out", required=True, help="training directory: checkpoints, log, and drafter/ at the end")
    add_verifier_flag(p)
    p.add_argument("--generate", action="store_true", help="first generate (or finish generating) the data")
    p.add_argument("--limit", type=int, help="with --generate: only the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=384, help="with --generate: answer budget")
    p.add_argument("--slots", type=int, default=64, help="with --generate: answers decoded at once (default: 64)")
    from ..distill.config import TrainConfig

    d = TrainConfig()
    for name in ("num_layers", "gamma", "blocks_per_seq", "batch_seqs", "steps", "warmup", "max_context",
                 "holdout", "seed", "checkpoint_every", "eval_every"):
        # training steps are --train-steps: --steps is the reveal steps of a block everywhere else
        flag = "--train-steps" if name == "steps" else "--" + name.replace("_", "-")
        p.add_argument(flag, dest=name, type=int, default=getattr(d, name),
                       help="optimiser steps" if name == "steps" else None)
    p.add_argument("--layers", type=_layer_list,
                   help="comma-separated verifier layers to start from, e.g. 0,1,2,3,14,29 (default: the first --num-layers)")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--position-decay", type=float, default=d.position_decay,
                   help="loss weight j**-decay for block position j")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=d.dtype)
    p.add_argument("--copy-input", action=argparse.BooleanOptionalAction, default=d.copy_input,
                   help="the network reads the copy hint (the hinted token and the match length) at "
                   "every masked position (default: on)")
    p.add_argument("--full-mask-share", type=float, default=d.full_mask_share,
                   help="share of training blocks that are fully masked, as at the first reveal step")
    p.add_argument("--early-share", type=float, default=d.early_share,
                   help="share of block starts drawn from the first --early-tokens answer tokens (default: 0)")
    p.add_argument("--early-tokens", type=int, default=d.early_tokens,
                   help=f"answer tokens that count as early (default: {d.early_tokens})")
    p.add_argument("--replay-answers", type=int, default=d.replay_answers,
                   help="held-out answers decoded again at each evaluation, the decode path's tokens per call "
                        f"(default: {d.replay_answers}; 0: off)")
    p.add_argument("--replay-tokens", type=int, default=d.replay_tokens,
                   help=f"first answer tokens those replays decode (default: {d.replay_tokens})")
    p.add_argument("--init-from", metavar="TRAIN_DIR",
                   help="start from the latest weights of another training run (same layout and held-out split) "
                        "with a fresh optimiser and schedule")
    add_threads_flag(p)
    p.add_argument("--export", action="store_true",
                   help="only write OUT/drafter from the latest checkpoint (the run may still be going)")
    _add_stop_flag(p)
    p.set_defaults(fn=_cmd_train)

    c = subparsers.add_parser(
        "fit-copy-prior",
        help="fit the drafter's copy prior (a pointer mixture over its context) on distillation data",
        description="Fit the mixture weights of the drafter's copy prior by maximum likelihood on distillation "
        "answers the drafter was not trained on (named shards, or the rows its training run held out), report "
        "held-out figures, and write copy_prior.json.",
    )
    c.add_argument("--data", help="distillation data directory (shards; with --fit-shards)")
    c.add_argument("--fit-shards", type=_names, help="comma-separated shard files to fit on")
    c.add_argument("--holdout-of", metavar="TRAIN_DIR",
                   help="instead of shards: the rows the drafter's training run TRAIN_DIR held out, the first half "
                        "to fit on and the second to evaluate")
    c.add_argument("--eval-shards", type=_names, default=(), help="comma-separated shard files for held-out figures")
    c.add_argument("--drafter", help="drafter directory (default: the embedded drafter)")
    add_verifier_flag(c)
    c.add_argument("--out", help="file or directory to write (default: the drafter directory's copy_prior.json)")
    c.add_argument("--gamma", type=int, default=32, help="block length sampled (default: 32)")
    c.add_argument("--per-row", type=int, default=6, help="block starts per answer (default: 6)")
    c.add_argument("--seed", type=int, default=0)
    add_threads_flag(c)
    c.set_defaults(fn=_cmd_fit_copy)


def _add_stop_flag(p) -> None:
    """``--stop-at-step`` of ``train-drafter``."""
    p.add_argument("--stop-at-step", type=bounded(int, 1, 10_000_000), metavar="N",
                   help="stop at step N of the --train-steps schedule with a checkpoint and export nothing (a rerun "
                        "without it goes on with the same schedule)")


def _names(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated shard file names")
    return names


def _cmd_fit_copy(a) -> int:
    from ..distill.copyfit import fit_copy_prior, fit_copy_prior_rows, holdout_answers, rows_sha256, write_copy_prior
    from ..engine.models.config import ModelConfig
    from ..engine.models.embedded import embedded_drafter_dir, file_sha256
    from ..engine.door import open_models
    from ..files import check_input_dir, check_output_path, check_writable_dir, read_json

    if (a.holdout_of is None) == (a.fit_shards is None):
        raise ValueError("give either --fit-shards (with --data) or --holdout-of TRAIN_DIR")
    if a.gamma < 1 or a.per_row < 1:
        raise ValueError(f"--gamma and --per-row must be >= 1, got {a.gamma} and {a.per_row}")
    if a.drafter:
        check_input_dir(a.drafter, "drafter directory")
    if a.fit_shards is not None:
        if not a.data:
            raise FileNotFoundError("--fit-shards needs --data")
        check_input_dir(a.data, "data directory", " (--fit-shards needs --data)")
        for name in (*a.fit_shards, *a.eval_shards):
            if not (Path(a.data) / name).is_file():
                raise FileNotFoundError(f"shard {Path(a.data) / name} does not exist")
    elif a.eval_shards:
        raise ValueError("--holdout-of evaluates on the second half of the held-out rows; drop --eval-shards")
    if a.out is not None:  # a file, or a directory to write copy_prior.json into
        (check_output_path(a.out) if a.out.endswith(".json") else check_writable_dir(a.out, "copy prior directory"))
    if a.holdout_of is not None:  # before the models load: a bad training directory refuses at once
        data_dir, rows = holdout_answers(Path(a.holdout_of))
    pair = open_models(ModelConfig(drafter=a.drafter, verifier=a.verifier, device="cpu", dtype="float32",
                                   threads=a.threads, copy_prior="off"), need_drafter=True)
    if a.fit_shards is not None:
        prior = fit_copy_prior(pair.drafter, Path(a.data), a.fit_shards, a.eval_shards, gamma=a.gamma,
                               per_row=a.per_row, seed=a.seed)
    else:
        half = len(rows) // 2
        prior = fit_copy_prior_rows(pair.drafter, rows[:half], rows[half:], gamma=a.gamma, per_row=a.per_row,
                                    seed=a.seed)
        run = read_json(Path(a.holdout_of) / "config.json", "training config")["train"]
        prior.meta["holdout_of"] = {"train_dir": str(a.holdout_of), "data": str(data_dir), "holdout": run["holdout"],
                                    "seed": run["seed"], "fit_rows_sha256": rows_sha256(rows[:half]),
                                    "eval_rows_sha256": rows_sha256(rows[half:])}
    ddir = Path(a.drafter) if a.drafter else embedded_drafter_dir()
    weights = sorted(ddir.glob("*.safetensors"))
    prior.meta["drafter_weights_sha256"] = {w.name: file_sha256(w) for w in weights}
    path = write_copy_prior(prior, Path(a.out) if a.out is not None else ddir)
    print(json.dumps({"copy_prior": str(path), **{k: prior.meta[k] for k in ("fit", "heldout") if k in prior.meta}}))
    return 0


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices, got {text!r}") from None


def _cmd_train(a) -> int:
    from ..distill.config import TrainConfig
    from ..distill.train import train
    from ..engine.models.source import verifier_dir
    from ..files import check_input_dir, check_writable_dir

    if a.layers:
        a.num_layers = len(a.layers)
    # every setting is checked before anything is generated, loaded or trained
    cfg = TrainConfig(**{k: getattr(a, k) for k in ("num_layers", "gamma", "blocks_per_seq", "batch_seqs", "steps",
                                                   "warmup", "max_context", "holdout", "seed", "checkpoint_every",
                                                   "eval_every", "lr", "dtype", "threads", "position_decay", "layers",
                                                   "copy_input", "full_mask_share", "early_share",
                                                   "early_tokens", "replay_answers", "replay_tokens",
                                                   "init_from")})
    if a.verifier and not a.verifier.lower().endswith(".gguf"):
        check_input_dir(a.verifier, "verifier directory")
    if not a.generate:
        check_input_dir(a.data, "data directory", " (use --generate)")
    if a.init_from and not (Path(a.init_from) / "train_state.safetensors").is_file():
        raise FileNotFoundError(f"--init-from {a.init_from}: no train_state.safetensors (not a drafter training "
                                "directory)")
    check_writable_dir(a.out, "training directory")
    vdir = verifier_dir(a.verifier)
    from ..engine.models.backbone import read_hf_config

    total = int(read_hf_config(vdir).get("num_hidden_layers", 0))
    if max(cfg.layers or [cfg.num_layers - 1]) >= total:
        raise ValueError(f"the verifier has {total} layers: --num-layers {cfg.num_layers} or --layers "
                         f"{list(cfg.layers or [])} asks for more")
    if a.export:
        from ..distill.train import export

        path = export(Path(a.out), vdir, evaluate_on=Path(a.data) if Path(a.data).exists() else None)
        print(json.dumps({"drafter": str(path)}))
        return 0
    if a.generate:
        from ..distill.generate import generate_distillation
        from ..distill.prompts import build_prompts

        generate_distillation(Path(a.data), build_prompts(), vdir, max_new_tokens=a.max_new_tokens,
                              slots=a.slots, threads=a.threads or 2, limit=a.limit)
    path = train(Path(a.data), Path(a.out), vdir, cfg, stop_at=a.stop_at_step)
    if path is None:
        print(json.dumps({"out": a.out, "stopped_at_step": a.stop_at_step}))
        return 0
    print(json.dumps({"drafter": str(path), **json.loads((path / "drafter.json").read_text())["meta"]["holdout"]}))
    return 0


def cmd_flag_leakage(a) -> int:
    import sys

    from ..distill.leakage import LEAKAGE_FILE, find_leaks, write_leakage
    from ..distill.prompts import build_prompts, read_prompts
    from ..distill.shards import PROMPTS_FILE

    data = Path(a.data)
    if not data.is_dir():
        raise NotADirectoryError(f"--data {a.data} is not a directory")
    path = data / PROMPTS_FILE
    prompts = read_prompts(path) if path.exists() else build_prompts()
    rec = write_leakage(data, prompts, find_leaks(prompts))
    print(f"{rec['flagged_count']} of {rec['prompts']} prompts flagged: {rec['by_rule']} {rec['by_source']} "
          f"-> {data / LEAKAGE_FILE}", file=sys.stderr)
    return 0


def _generate_data(subparsers) -> None:
    from ..distill.prompts import SOURCES

    g = subparsers.add_parser(
        "generate-data", help="the verifier's greedy answers to the training prompts (resumable shards)",
        description="Answer every training prompt greedily with the verifier (continuous batching, the exact "
        "greedy head) and store the answers as compact shards with their manifest, index.json. Rerun the "
        "same command to resume; a kill loses at most the shards in flight.")
    g.add_argument("--out", required=True, help="output directory (rerun with it to resume)")
    g.add_argument("--prompts", help="prompt list (JSONL); default: OUT/prompts.jsonl when it exists, else the "
                                     "built list")
    g.add_argument("--sources", default=",".join(SOURCES), help=f"prompt sources (default: {','.join(SOURCES)})")
    g.add_argument("--seed", type=int, default=0, help="seed of the built prompt list (default: 0)")
    add_verifier_flag(g, help="verifier directory or .gguf file (default: the embedded verifier)")
    g.add_argument("--limit", type=bounded(int, 1, 10_000_000), help="only the first N prompts")
    add_threads_flag(g, default=2, help="torch CPU threads (default: 2)")
    g.add_argument("--slots", type=int, default=64, help="answers decoded at once (default: 64)")
    g.add_argument("--max-new-tokens", type=int, default=384, help="answer budget (default: 384)")
    g.add_argument("--shard-size", type=int, default=256, help="prompts per shard (default: 256)")
    g.add_argument("--check", type=bounded(int, 0, 1_000_000), default=0, metavar="N",
                   help="only compare the engine with transformers' greedy generate on N prompts")
    g.add_argument("--summary", metavar="FILE",
                   help="only check OUT's shards against their hashes and write its totals (JSON) to FILE")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.set_defaults(fn=cmd_generate_data)


def cmd_generate_data(a) -> int:
    import sys
    import time

    from ..distill.generate import check_agreement, generate_distillation, resolve_prompts
    from ..distill.prompts import count_by_source
    from ..distill.shards import dataset_totals
    from ..files import check_output_path, check_writable_dir, write_json

    if a.summary:
        summary = dataset_totals(Path(a.out))
        write_json(check_output_path(a.summary, "--summary"), summary)
        print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))
        return 0
    from ..distill.prompts import SOURCES
    from ..engine.models.source import verifier_dir as resolve

    sources = [x.strip() for x in a.sources.split(",") if x.strip()]
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown or not sources:
        raise ValueError(f"--sources: unknown {', '.join(unknown) or '(none given)'}; expected some of {', '.join(SOURCES)}")
    check_writable_dir(a.out, "data directory")
    verifier_dir = resolve(a.verifier)  # every argument checked first: a first use reads the GGUF's tokenizer
    prompts = resolve_prompts(a.out, a.prompts, sources, a.seed)
    if a.check:
        from ..engine.runtime import Runtime

        Runtime(threads=a.threads).activate()
        step = max(1, len(prompts) // a.check)
        t = time.time()
        report = check_agreement(verifier_dir, prompts[::step][: a.check], a.max_new_tokens, slots=a.slots)
        report["seconds"] = round(time.time() - t, 1)
        print(json.dumps(report, indent=1))
        return 0
    print(f"[distill] prompts: {count_by_source(prompts)}", file=sys.stderr, flush=True)
    index = generate_distillation(
        a.out, prompts, verifier_dir, max_new_tokens=a.max_new_tokens, slots=a.slots, threads=a.threads,
        shard_size=a.shard_size, limit=a.limit, progress=not a.no_progress,
        command=getattr(a, "command_line", None) or "vskip generate-data",
    )
    print(f"[distill] done: {len(index['shards'])} shard(s) in {a.out}", file=sys.stderr, flush=True)
    return 0
