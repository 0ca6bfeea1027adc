"""The subcommands whose work lives in the library's larger modules (sweep, report,
train-predictor, diagnose), registered here without importing those modules: building the parser
imports neither torch nor numpy, and a command imports its module only when it runs."""

from __future__ import annotations

import argparse
import importlib

from .cli import add_block_flags, add_model_flags
from .defaults import GAMMA, K_MIN, S_MAX, STEPS

#: the named grids of ``vskip sweep`` (``vskip.sweep.GRIDS`` holds them; a test keeps both equal)
GRID_NAMES = ("table5", "kmin", "gates", "periodic", "transfer", "cpu-small", "cpu-kmin", "cpu-signals", "prefix")
#: the survival predictors (``vskip.traces.KINDS``) and the prefix model (``vskip.prefix_model.KIND``)
PREDICTOR_KINDS = ("marginal", "conditional", "prefix")


def _lazy(module: str, fn: str):
    """A handler that imports ``vskip.<module>`` when the command runs."""

    def run(a):
        return getattr(importlib.import_module(f"vskip.{module}"), fn)(a)

    return run


def register(subparsers) -> None:
    for add in (_sweep, _report, _train_predictor, _diagnose, _calibrate_prefix):
        add(subparsers)


def _sweep_flags(s) -> None:
    s.add_argument("--task", help="humaneval, mbpp, mbpp_plus, math500 or gsm8k")
    s.add_argument("--grid", help=f"named grid: {', '.join(GRID_NAMES)}")
    s.add_argument("--out", help="sweep directory: one run directory per configuration, and sweep.json")
    s.add_argument("--list", action="store_true", help="print the grid's configurations and exit")
    s.add_argument("--limit", type=int, help="first N prompts")
    s.add_argument("--ids", help="comma-separated task ids")
    w = s.add_argument_group("execution")
    w.add_argument("--workers", type=int, default=1, help="worker processes, each loading the models once (default: 1)")
    w.add_argument("--shards", type=int,
                   help="shards of the prompts per configuration (default: 1 with one worker, else enough to keep "
                        "all workers busy); a resumed sweep keeps the recorded value")
    w.add_argument("--executor", choices=("local", "ray"), default="local", help="local processes or Ray tasks")
    w.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    w.add_argument("--gpus-per-worker", type=float, default=0.0, help="Ray: GPUs reserved per worker (default: 0)")
    w.add_argument("--score", action=argparse.BooleanOptionalAction, default=True, help="score by execution")
    w.add_argument("--quiet", action="store_true", help="no progress bar")
    g = s.add_argument_group("decoding (shared by every configuration)")
    g.add_argument("--gamma", type=int, default=GAMMA, help=f"draft block length (default: {GAMMA}; the paper: 32)")
    g.add_argument("--steps", type=int, default=STEPS, help=f"diffusion steps per block (default: {STEPS}; the paper: 2)")
    add_block_flags(g)
    g.add_argument("--k-min", type=int, default=K_MIN, help=f"k_min where the grid does not set it (default: {K_MIN})")
    g.add_argument("--s-max", type=int, default=S_MAX, help=f"s_max where the grid does not set it (default: {S_MAX})")
    g.add_argument("--max-new-tokens", type=int, default=512, help="output budget (default: 512)")
    g.add_argument("--shadow", action=argparse.BooleanOptionalAction, default=True, help="shadow-verify skipped rounds")
    g.add_argument("--predictor", help="trained survival predictors; without it marginal/conditional are skipped")
    add_model_flags(s, threads_help="torch CPU threads per worker (default: cores / workers)")


def _sweep(subparsers) -> None:
    """Add ``vskip sweep`` to the CLI's subparsers."""
    s = subparsers.add_parser(
        "sweep", help="run every configuration of a named grid (resumable)",
        description="Run every configuration of a named grid as resumable units (configuration x shard of "
                    "prompts) on local worker processes or Ray; one run directory per configuration under --out.",
    )
    _sweep_flags(s)
    s.set_defaults(fn=_lazy("sweep", "cmd_sweep"))


def _report(subparsers) -> None:
    """Add ``vskip report`` to the CLI's subparsers."""
    r = subparsers.add_parser(
        "report", help="frontiers, tables and figures from finished runs (no model needed)",
        description="Read run directories (or sweep directories holding them) and write the paper's frontiers "
                    "(Figures 1, 4, 5), tables (2, 3, 4), the matched-quality comparison, bootstrap intervals and "
                    "the Eq. 8 break-even analysis as PNG, Markdown and CSV, laid out in report.md.",
    )
    r.add_argument("dirs", nargs="+", help="run directories or directories holding them")
    r.add_argument("--out", required=True, help="output directory")
    r.add_argument("--frontier-k-min", dest="k_min", type=int, default=K_MIN,
                   help=f"the k_min of the signal runs drawn as frontiers (default: {K_MIN})")
    r.add_argument("--bootstrap", type=int, default=10_000, help="paired bootstrap resamples (default: 10000)")
    r.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0)")
    r.add_argument("--archive", action="store_true",
                   help="also write OUT/runs.tar.xz: the run files behind the report (configs, samples, rounds, "
                        "summaries; no traces), so it can be regenerated from what is committed")
    r.set_defaults(fn=_lazy("report", "cmd_report"))


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
    p.add_argument("--epochs", type=int, help="training epochs (default: 15; prefix: 30)")
    p.add_argument("--hidden", type=int, default=64, help="prefix: width of the GRU (default: 64)")
    p.add_argument("--on-policy", nargs="+", metavar="RUN_DIR",
                   help="prefix: traces of `vskip run --policy prefix --trace` (shadow-verified skips) added to each "
                        "rotation's training prompts (DAgger-style rounds)")
    p.add_argument("--calibration-folds", type=int, default=1,
                   help="prefix: folds that calibrate each rotation's threshold (default: 1; conformal risk "
                        "control at alpha needs at least 1/alpha - 1 calibration prompts)")
    p.add_argument("--seed", type=int, default=0, help="training seed (default: 0)")
    p.add_argument("--batch-size", type=int, help="positions per batch (default: 4096; prefix: 256 blocks)")
    p.add_argument("--lr", type=float, help="Adam learning rate (default: 1e-3; prefix: 3e-3)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=_lazy("predictor", "cmd_train_predictor"))


def _diagnose(subparsers) -> None:
    """Add ``diagnose`` to the vskip command line."""
    p = subparsers.add_parser(
        "diagnose", help="offline BCE, AUROC, permutation and Proposition 1 diagnostics from traces",
        description="Per-position BCE (Figure 3) and AUROC (Figure 6) on held-out folds, the permutation "
                    "diagnostic (Table 1) and a simulation of Proposition 1, from `--trace` runs.")
    p.add_argument("traces", nargs="+", metavar="TRACE_RUN_DIR", help="trace run directories")
    p.add_argument("--predictors", help="directory from `vskip train-predictor` (default: raw confidence only)")
    p.add_argument("--out", required=True, help="output directory for figures, tables and diagnose.md")
    p.add_argument("--repetitions", type=int, default=100, help="permutations (default: 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the permutations and simulation (default: 0)")
    p.add_argument("--device", help="device for scoring with the predictors (default: cuda when available)")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.set_defaults(fn=_lazy("diagnose", "cmd_diagnose"))


def _calibrate_prefix(subparsers) -> None:
    """Add ``vskip calibrate-prefix`` to the CLI's subparsers."""
    c = subparsers.add_parser(
        "calibrate-prefix", help="the --lam of --policy prefix that keeps a promised agreement (beyond the paper)",
        description="Conformal risk control on Strict SDD traces: the smallest threshold whose replayed share of "
                    "disagreeing tokens meets the finite-sample bound for alpha. Prints it; see docs/prefix.md.",
    )
    c.add_argument("traces", nargs="+", help="--trace run directories of Strict SDD")
    c.add_argument("--alpha", type=float, required=True, help="the promised expected share of disagreeing tokens")
    c.add_argument("--step", type=float, default=0.005, help="grid step of the threshold (default: 0.005)")
    c.add_argument("--out", help="write the calibration as JSON here")
    c.set_defaults(fn=_lazy("calibrate", "cmd_calibrate_prefix"))
