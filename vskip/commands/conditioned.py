"""The conditioned drafter's commands: ``vskip extract-features`` (the verifier's tapped hidden
states over the distillation rows) and ``vskip train-conditioned`` (training, resumable, and the
export of a shippable drafter directory)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .flags import add_device_flag, add_threads_flag, add_verifier_flag


def register(subparsers) -> None:
    e = subparsers.add_parser(
        "extract-features", help="the verifier's hidden states over the distillation answers (resumable)",
        description="Run the verifier over the distillation rows and store the outputs of the tapped layers "
        "(bfloat16) in chunks: chunk 0 holds the held-out rows, the rest the training rows in a seeded order. "
        "Rerun to resume or extend; --until and --max-rows bound one run.")
    e.add_argument("--data", required=True, help="distillation data directory (shards)")
    e.add_argument("--out", required=True, help="features directory")
    add_verifier_flag(e)
    e.add_argument("--layers", type=_layers, help="comma-separated verifier layers to tap "
                   "(default: --taps layers spread as DFlash spreads them)")
    e.add_argument("--taps", type=int, default=5, help="how many layers to tap when --layers is not given (default: 5)")
    e.add_argument("--holdout", type=int, default=64, help="held-out prompts (default: 64; as train-conditioned)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--max-rows", type=int, help="training rows to extract at most")
    e.add_argument("--until", metavar="HH:MM", help="start no new chunk after this local time")
    add_threads_flag(e)
    add_device_flag(e, help="cpu, cuda or cuda:N for the verifier's forwards (default: cuda when available)")
    e.set_defaults(fn=cmd_extract)

    from ..distill.config import ConditionedTrainConfig

    d = ConditionedTrainConfig()
    t = subparsers.add_parser(
        "train-conditioned", help="train the conditioned drafter on extracted features (resumable)",
        description="Train a drafter that reads the verifier's hidden states (the DFlash design) on features "
        "from vskip extract-features, with held-out acceptance per unverified-tail length and on the decode "
        "path; writes OUT/drafter (fp16 weights, manifest) at the end or with --export.")
    t.add_argument("--data", required=True, help="distillation data directory (shards)")
    t.add_argument("--features", required=True, help="features directory (vskip extract-features)")
    t.add_argument("--out", required=True, help="training directory: checkpoints, log, curve, drafter/")
    add_verifier_flag(t)
    for name in ("num_layers", "block_size", "blocks_per_seq", "batch_seqs", "steps", "warmup", "max_tail",
                 "holdout", "seed", "checkpoint_every", "eval_every", "eval_blocks", "replay_answers",
                 "replay_tokens"):
        flag = "--train-steps" if name == "steps" else "--" + name.replace("_", "-")
        t.add_argument(flag, dest=name, type=int, default=getattr(d, name), help=f"default: {getattr(d, name)}")
    for name in ("lr", "no_tail_share", "loss_decay"):
        t.add_argument("--" + name.replace("_", "-"), dest=name, type=float, default=getattr(d, name),
                       help=f"default: {getattr(d, name)}")
    t.add_argument("--until", metavar="HH:MM", help="stop at a checkpoint after this local time (resume later)")
    add_threads_flag(t)
    add_device_flag(t, help="cpu, cuda or cuda:N (default: cuda when available); a run resumes on any device")
    t.add_argument("--export", action="store_true", help="only write OUT/drafter from the latest checkpoint")
    t.set_defaults(fn=cmd_train)


def _layers(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices, got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one layer index")
    return out


def _until(text: str | None) -> float | None:
    """``HH:MM`` today (tomorrow if already past) as a ``time.time()``."""
    if text is None:
        return None
    import datetime as dt

    try:
        h, m = (int(x) for x in text.split(":"))
        at = dt.datetime.now().replace(hour=h, minute=m, second=0, microsecond=0)
    except ValueError:
        raise ValueError(f"--until takes a local time HH:MM, got {text!r}") from None
    if at < dt.datetime.now():
        at += dt.timedelta(days=1)
    return at.timestamp()


def _verifier(a) -> Path:
    if a.verifier:
        from ..files import check_input_dir

        return check_input_dir(a.verifier, "verifier directory")
    from ..engine.models.embedded import embedded_verifier_dir

    return embedded_verifier_dir()


def cmd_extract(a) -> int:
    from ..files import check_input_dir, check_writable_dir

    check_input_dir(a.data, "data directory")
    if a.taps < 1 or a.holdout < 0 or (a.max_rows is not None and a.max_rows < 0):
        raise ValueError("--taps must be >= 1, --holdout and --max-rows >= 0")
    until = _until(a.until)
    from ..engine.runtime import training_device

    device = training_device(a.device)
    check_writable_dir(a.out, "features directory")
    vdir = _verifier(a)
    from ..distill.taps import extract, summary
    from ..engine.models.backbone import read_hf_config
    from ..engine.models.conditioned import default_target_layers

    layers = a.layers or default_target_layers(int(read_hf_config(vdir)["num_hidden_layers"]), a.taps)
    idx = extract(Path(a.data), Path(a.out), vdir, tuple(layers), holdout=a.holdout, seed=a.seed,
                  max_rows=a.max_rows, until=until, threads=a.threads, device=device)
    print(json.dumps({"features": str(a.out), "layers": list(layers), **summary(idx)}))
    return 0


def cmd_train(a) -> int:
    from ..distill.config import ConditionedTrainConfig
    from ..distill.train_conditioned import export, train
    from ..files import check_input_dir, check_writable_dir

    cfg = ConditionedTrainConfig(**{k: getattr(a, k) for k in (
        "num_layers", "block_size", "blocks_per_seq", "batch_seqs", "steps", "warmup", "max_tail", "holdout", "seed",
        "checkpoint_every", "eval_every", "eval_blocks", "replay_answers", "replay_tokens", "lr", "no_tail_share",
        "loss_decay", "threads")})
    until = _until(a.until)
    from ..engine.runtime import training_device

    device = training_device(a.device)
    for what, p in (("data directory", a.data), ("features directory", a.features)):
        check_input_dir(p, what)
    if not (Path(a.features) / "index.json").is_file():
        raise FileNotFoundError(f"{a.features} holds no index.json (make it with vskip extract-features)")
    check_writable_dir(a.out, "training directory")
    vdir = _verifier(a)
    if not a.export:
        train(Path(a.data), Path(a.features), Path(a.out), vdir, cfg, until=until, device=device)
    ddir = export(Path(a.out), Path(a.data), Path(a.features), vdir)
    print(json.dumps({"drafter": str(ddir), **json.loads((ddir / "manifest.json").read_text())["holdout"]}))
    return 0
