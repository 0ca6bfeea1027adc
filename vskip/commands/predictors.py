"""The learned signals' commands: ``vskip train-predictor``, ``vskip diagnose``,
``vskip calibrate-prefix`` and ``vskip calibrate-online``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .flags import MAX_SEED, add_batch_flag, add_device_flag, add_threads_flag, bounded

#: the survival predictors (``vskip.study.traces.KINDS``) and the prefix model (``vskip.study.prefix.model.KIND``)
PREDICTOR_KINDS = ("marginal", "conditional", "prefix")


def register(subparsers) -> None:
    for add in (_train_predictor, _diagnose, _calibrate_prefix, _calibrate_online):
        add(subparsers)



def _train_predictor(subparsers) -> None:
    """Add ``train-predictor`` to the vskip command line."""
    p = subparsers.add_parser(
        "train-predictor", help="train a survival predictor (5 rotations) on Strict SDD traces",
        description="Train the marginal or conditional survival MLP of A.7, or the prefix survival model "
                    "of --policy prefix (beyond the paper), on the block traces of "
                    "`vskip run --policy strict --trace` runs, one checkpoint per fold rotation.")
    p.add_argument("--kind", required=True, choices=PREDICTOR_KINDS,
                   help="marginal (1{L>=j}), conditional (at-risk set) or prefix (P(L>=k) of the whole block, "
                        "with a calibrated threshold per fold)")
    p.add_argument("--traces", required=True, nargs="+", metavar="RUN_DIR", help="trace run directories")
    p.add_argument("--out", required=True, help="predictor directory (checkpoints go to OUT/KIND/)")
    p.add_argument("--epochs", type=bounded(int, 1, 100_000), help="training epochs (default: 15; prefix: 30)")
    p.add_argument("--hidden", type=bounded(int, 1, 4096), default=64, help="prefix: width of the GRU (default: 64)")
    p.add_argument("--on-policy", nargs="+", action="append", metavar="RUN_DIR",
                   help="prefix: traces of `vskip run --policy prefix --trace` (shadow-verified skips) added to each "
                        "rotation's training prompts (DAgger-style rounds); repeat the option once per round, oldest "
                        "first, to train on every round's blocks")
    p.add_argument("--calibrate-on", choices=("strict", "on-policy"),
                   help="prefix: the blocks each rotation's threshold is calibrated on: the calibration prompts' "
                        "Strict SDD blocks, or their --on-policy blocks of the last round, drafted after the "
                        "scheduler's own skips as the policy meets them online (default: on-policy where "
                        "--on-policy is given, strict otherwise)")
    p.add_argument("--calibration-folds", type=int, default=1,
                   help="prefix: folds that calibrate each rotation's threshold (default: 1; conformal risk "
                        "control at alpha needs at least 1/alpha - 1 calibration prompts)")
    p.add_argument("--seed", type=int, default=0, help="training seed (default: 0)")
    p.add_argument("--batch-size", type=int, help="positions per batch (default: 4096; prefix: 256 blocks)")
    p.add_argument("--lr", type=float, help="Adam learning rate (default: 1e-3; prefix: 3e-3)")
    add_device_flag(p)
    add_threads_flag(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_train_predictor)



def cmd_train_predictor(a) -> int:
    from ..engine.runtime import resolve_runtime
    from ..files import check_writable_dir
    from ..study.predictor import PredictorTrainConfig, train_predictor
    from ..study.traces import load_traces, run_policy

    runtime = resolve_runtime(a.device, None, a.threads)
    runtime.activate()
    given = {k: getattr(a, k) for k in ("epochs", "batch_size", "lr") if getattr(a, k) is not None}
    if a.kind == "prefix":
        from ..study.prefix.model import PrefixTrainConfig

        cfg = PrefixTrainConfig(seed=a.seed, hidden=a.hidden, **given)
    else:
        cfg = PredictorTrainConfig(kind=a.kind, seed=a.seed, device=runtime.device, **given)
    check_writable_dir(a.out, "predictor directory")
    for run in a.traces:
        pol = run_policy(run)
        if pol is not None and pol != "strict":
            raise ValueError(f"predictors are trained on Strict SDD traces only (A.7); {run} was decoded with --policy {pol}")
    ts = load_traces(a.traces)
    if a.on_policy and a.kind != "prefix":
        raise ValueError("--on-policy traces train the prefix model only (--kind prefix)")
    if a.calibrate_on is None:  # thresholds calibrated on Strict SDD blocks broke the promise online
        a.calibrate_on = "on-policy" if a.on_policy else "strict"
    if a.calibrate_on == "on-policy" and not a.on_policy:
        raise ValueError("--calibrate-on on-policy needs --on-policy traces")
    if a.kind == "prefix":
        from ..study.prefix.model import train_prefix_predictor

        on_policy = []
        for group in a.on_policy or []:  # one trace set per round
            for run in group:
                if run_policy(run) != "prefix":
                    raise ValueError(f"--on-policy takes runs of --policy prefix --trace; {run} is not one")
            on_policy.append(load_traces(group))
        man = train_prefix_predictor(ts, cfg, a.out, a.calibration_folds, progress=not a.quiet, on_policy=on_policy,
                                     calibrate_on=a.calibrate_on)
        fit = {"stop_nll": [round(e["stop_nll"], 4) for e in man["rotations"]],
               "calibration_prompts": [e["n_cal_prompts"] for e in man["rotations"]]}
    else:
        man = train_predictor(ts, cfg, a.out, progress=not a.quiet)
        fit = {"val_bce": [round(e["val_bce"], 4) for e in man["rotations"]]}
    print(json.dumps({"kind": man["kind"], "out": str(Path(a.out) / a.kind), "prompts": man["n_prompts"],
                      "blocks": man["n_blocks"], **fit}))
    return 0



def _diagnose(subparsers) -> None:
    """Add ``diagnose`` to the vskip command line."""
    p = subparsers.add_parser(
        "diagnose", help="offline BCE, AUROC, permutation and Proposition 1 diagnostics from traces",
        description="Per-position BCE (Figure 3) and AUROC (Figure 6) on held-out folds, the permutation "
                    "diagnostic (Table 1) and a simulation of Proposition 1, from `--trace` runs.")
    p.add_argument("traces", nargs="+", metavar="TRACE_RUN_DIR", help="trace run directories")
    p.add_argument("--predictors", help="directory from `vskip train-predictor` (default: raw confidence only)")
    p.add_argument("--out", required=True, help="output directory for figures, tables and diagnose.md")
    p.add_argument("--repetitions", type=bounded(int, 1, 1_000_000), default=100, help="permutations (default: 100)")
    p.add_argument("--seed", type=bounded(int, 0, MAX_SEED), default=0, help="seed of the permutations and simulation (default: 0)")
    p.add_argument("--alpha", type=float, nargs="+", default=[0.01, 0.02, 0.05],
                   help="prefix model: the risks whose calibrated thresholds are replayed on the traces "
                        "(default: 0.01 0.02 0.05)")
    add_device_flag(p, help="device for scoring with the predictors (default: cuda when available)")
    add_threads_flag(p)
    p.set_defaults(fn=cmd_diagnose)



def cmd_diagnose(a) -> int:
    from ..engine.runtime import resolve_runtime
    from ..study.diagnose import DiagnoseConfig, diagnose

    runtime = resolve_runtime(a.device, None, a.threads)
    runtime.activate()
    if any(not 0 < x < 1 for x in a.alpha):
        raise ValueError(f"--alpha must lie in (0, 1), got {a.alpha}")
    cfg = DiagnoseConfig(repetitions=a.repetitions, seed=a.seed, alphas=tuple(a.alpha))
    from ..files import check_writable_dir

    check_writable_dir(a.out, "diagnose directory")
    s = diagnose(a.traces, a.out, predictors=a.predictors, cfg=cfg, runtime=runtime)
    print(json.dumps({"out": str(Path(a.out) / "diagnose.md"), "blocks": s["blocks"], "bce": s["bce"],
                      "permutation": {p["signal"]: [round(p["original"], 3), round(p["permuted_mean"], 3)]
                                      for p in s["permutation"]}}))
    return 0



def _calibrate_prefix(subparsers) -> None:
    """Add ``vskip calibrate-prefix`` to the CLI's subparsers."""
    c = subparsers.add_parser(
        "calibrate-prefix", help="the --lam of --policy prefix that keeps a promised agreement (beyond the paper)",
        description="Conformal risk control on Strict SDD traces: the smallest threshold whose replayed share of "
                    "disagreeing tokens meets the finite-sample bound for alpha. Prints it; see docs/prefix.md.",
    )
    c.add_argument("traces", nargs="+", help="--trace run directories of Strict SDD")
    c.add_argument("--alpha", type=float, required=True, help="the promised expected share of disagreeing tokens")
    c.add_argument("--step", type=bounded(float, 1e-4, 0.5), default=0.005, help="grid step of the threshold (default: 0.005)")
    c.add_argument("--out", help="write the calibration as JSON here")
    c.set_defaults(fn=cmd_calibrate_prefix)



def cmd_calibrate_prefix(a) -> int:
    import numpy as np

    from ..files import check_output_path, write_json
    from ..study.prefix.calibrate import calibrate_traces

    if a.out is not None:
        check_output_path(a.out)
    cal, record = calibrate_traces(a.traces, a.alpha, a.step)
    record["command"] = getattr(a, "command_line", None)
    if a.out is not None:
        write_json(a.out, record)
    if cal.lam == float("inf"):
        print(f"no threshold keeps alpha = {a.alpha} with {cal.n} prompts (the bound needs at least "
              f"{int(np.ceil(1 / a.alpha - 1))}): never skip", file=sys.stderr)
    else:
        print(f"--lam {cal.lam:g}: replayed risk {cal.risk:.4f} on {cal.n} prompts, bound {cal.bound:.4f} <= "
              f"alpha {a.alpha}", file=sys.stderr)
    print(f"{cal.lam:g}")
    return 0


def _calibrate_online(subparsers) -> None:
    """Add ``vskip calibrate-online init|choose|sweep|finished`` to the CLI's subparsers."""
    c = subparsers.add_parser(
        "calibrate-online", help="thresholds of the prefix model chosen on its own online decodes (beyond the paper)",
        description="Calibrate the prefix scheduler on the policy's own behaviour. `init` copies one rotation of a "
                    "trained prefix model and writes its calibration and test prompt ids per task; `sweep cal` "
                    "decodes the calibration prompts at a grid of --lam (`vskip sweep --grid online-cal`, every task "
                    "side by side); `finished` lists the runs of the thresholds every task finished; `choose` reads "
                    "those runs and picks, per alpha, the threshold by conformal risk control on the loss's envelope "
                    "(and by Learn then Test beside it); then `sweep test` decodes the test prompts with `--alpha A` "
                    "and this model (`vskip sweep --grid online-test`). See docs/prefix.md.",
    )
    sub = c.add_subparsers(dest="action", required=True)
    i = sub.add_parser("init", help="copy one rotation of a prefix model, and write its prompt ids")
    i.add_argument("--predictor", required=True, help="a trained prefix model (train-predictor --kind prefix)")
    i.add_argument("--rotation", type=bounded(int, 0, 99), default=0, help="which rotation (default: 0)")
    i.add_argument("--out", required=True, help="new directory for the one-rotation model")
    i.set_defaults(fn=cmd_calibrate_online_init)
    ch = sub.add_parser("choose", help="choose the thresholds from the calibration runs")
    ch.add_argument("predictor", help="the directory `init` wrote")
    ch.add_argument("runs", nargs="+", help="run directories of --lam decodes of the calibration prompts "
                                            "(a sweep's run directories; every task's)")
    ch.add_argument("--alpha", type=bounded(float, 1e-6, 0.999), action="append",
                    help="a promised risk (repeat for several; default: those grid online-test decodes at)")
    ch.add_argument("--delta", type=bounded(float, 1e-6, 0.5), default=0.1,
                    help="Learn then Test's error level, reported beside (default: 0.1)")
    ch.set_defaults(fn=cmd_calibrate_online_choose)
    sw = sub.add_parser("sweep", help="decode a part's prompts of every task at its grid, the tasks side by side")
    sw.add_argument("part", choices=("cal", "test"),
                    help="cal: the calibration prompts at grid online-cal; test: the test prompts at grid online-test")
    sw.add_argument("predictor", help="the directory `init` wrote")
    sw.add_argument("--out", required=True, help="one sweep directory per task goes under it (OUT/TASK)")
    sw.add_argument("--max-new-tokens", type=bounded(int, 1, 1 << 20), required=True, help="output budget")
    add_threads_flag(sw, default=1, help="torch CPU threads of each task's sweep (default: 1)")
    add_batch_flag(sw)
    sw.add_argument("--until", metavar="HH:MM", help="stop at this local time (a rerun resumes)")
    sw.set_defaults(fn=cmd_calibrate_online_sweep)
    fi = sub.add_parser("finished", help="print the calibration runs of the thresholds every task finished")
    fi.add_argument("predictor", help="the directory `init` wrote")
    fi.add_argument("cal", help="the directory `sweep cal` decoded into")
    fi.set_defaults(fn=cmd_calibrate_online_finished)


def cmd_calibrate_online_init(a) -> int:
    from ..files import check_writable_dir
    from ..study.prefix.model import load_prefix_predictor, write_online_predictor
    from ..study.prefix.online import write_ids

    check_writable_dir(a.out, "directory of the one-rotation model")
    write_online_predictor(a.predictor, a.rotation, a.out)
    for path, n in write_ids(a.out, *load_prefix_predictor(a.out).online_ids):
        print(f"{path}: {n} {path.suffix[1:]} prompts", file=sys.stderr)
    return 0


def cmd_calibrate_online_sweep(a) -> int:
    from ..files import check_writable_dir
    from ..study.jobs import Processes, deadline
    from ..study.prefix.online import sweep_commands

    check_writable_dir(a.out, "directory of the sweeps")
    Processes(deadline(a.until), what="calibrate-online")(
        sweep_commands(a.predictor, a.part, a.out, a.max_new_tokens, a.threads, a.batch_size), timed=True)
    return 0


def cmd_calibrate_online_finished(a) -> int:
    from ..study.prefix.online import finished

    runs = finished(a.predictor, a.cal)
    if not runs:
        raise ValueError(f"no threshold has finished on every task under {a.cal}")
    print("\n".join(map(str, runs)))
    return 0


def cmd_calibrate_online_choose(a) -> int:
    from ..study.grids import ONLINE_ALPHA
    from ..study.prefix.calibrate import choose_online

    rec = choose_online(a.predictor, a.runs, a.alpha or ONLINE_ALPHA, a.delta)
    for r in rec["choices"]:
        lam = "never skip" if r["lam"] is None else f"lam {r['lam']:g}"
        ltt = "never skip" if r["ltt_lam"] is None else f"lam {r['ltt_lam']:g}"
        print(f"alpha {r['alpha']:g}: {lam} (CRC on the envelope, bound {r['crc_bound']:.4f}, {rec['n_prompts']} "
              f"prompts); Learn then Test at delta {rec['delta']:g}: {ltt}")
    return 0
