"""bench_batch's workload: the configurations it can decode (and their settings), the prompts, the
batch sizes, and the command line a result records."""

from __future__ import annotations

import sys
from pathlib import Path

from vskip.defaults import SHAPES

#: name -> (policy, its parameters, decode settings over the command's, predictor directory)
CONFIGS = {
    "ar": ("ar", {}, {}, None),
    "strict": ("strict", {}, {}, None),
    # the same, collecting the A.7 inputs of every block as `vskip run --trace` does (the traces the
    # predictors train on; their writing to the run directory aside): what tracing costs at B
    "strict-trace": ("strict", {}, {"trace": True}, None),
    "fast": ("strict", {}, {"gamma": 4, "gamma_max": 16, "min_match": 6, "trim": 0.5}, None),
    # Strict SDD in the default preset's shape (trimming at 0.3; vskip.defaults.SHAPES["default"])
    "default": ("strict", {}, {k: v for k, v in SHAPES["default"].items() if k in ("gamma", "gamma_max", "min_match",
                                                                                   "trim")}, None),
    "raw": ("raw", {"eta_b": 0.9, "eta_c": 0.93, "k_min": 6, "s_max": 64}, {}, None),  # the paper's gates
    # the prefix scheduler at alpha 0.05 with the committed online-calibrated model (decode its test
    # prompts: --ids-file docs/results/online/predictor/ids/humaneval.test; 128 new tokens, gamma 8)
    "prefix": ("prefix", {"alpha": 0.05, "survival": "model", "cost_ratio": 0.22}, {},
               "docs/results/online/predictor/prefix"),
    # the prefix scheduler at alpha 0.05 with the full-scale round-2 model (5 folds over HumanEval's
    # 164 and MBPP's first 200 prompts, 256 new tokens, gamma 8: docs/results/scheduler.md), so that
    # every prompt of the protocol lies in a test fold
    "prefix-full": ("prefix", {"alpha": 0.05, "survival": "model"}, {}, "docs/results/full/predictors-round2/prefix"),
}
#: a configuration named NAME:padded is NAME with the verifier's and the drafter's rows padded to the
#: longest instead of packed (vskip.engine.models.attention.packed, drafter_body.TorchBody), to measure what
#: packing buys
PADDED = ":padded"
#: the configurations that must decode batch-1 ``ar``'s tokens (their differing outputs get a gap)
LOSSLESS = ("ar", "strict", "strict-trace", "fast", "default", *(n + PADDED for n in ("ar", "strict", "fast", "default")))


def _settings(name: str, gamma: int, max_new: int, shadow: bool = False, threads: int = 2):
    from vskip.engine.decode import DecodeConfig
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.policy import PolicyConfig
    from vskip.engine.settings import Settings

    policy, params, decode, predictor = CONFIGS[name.removesuffix(PADDED)]
    cfg = DecodeConfig(**{"gamma": gamma, "max_new_tokens": max_new, "shadow": shadow, **decode})
    return Settings(PolicyConfig.make(policy, **params), cfg, ModelConfig(device="cpu", threads=threads, steps=1), predictor=predictor)


def unknown_configs(configs: str) -> list[str]:
    """The names of ``--configs`` that are no configuration (nor one's NAME:padded)."""
    return [n for n in configs.split(",") if n.removesuffix(PADDED) not in CONFIGS]


def config_names(configs: str) -> list[str]:
    """``--configs``'s comma-separated configuration names."""
    return [c for c in configs.split(",") if c]


def batch_sizes(batch: str) -> list[int]:
    """``--batch``'s comma-separated batch sizes."""
    return [int(b) for b in batch.split(",")]


def load_prompts(a, tokenizer) -> list[tuple[str, list[int]]]:
    """(task id, prompt tokens) of the first ``--limit`` problems of ``--task`` (of ``--ids-file``'s, where given)."""
    from vskip.bench import tasks

    ids = Path(a.ids_file).read_text().strip().split(",") if a.ids_file else None
    problems = tasks.load_task(a.task, ids=ids)[: a.limit]
    return [(pr.task_id, tasks.encode_problem(tokenizer, pr)) for pr in problems]


def command_line(argv=None) -> str:
    """The command a result records: this script with ``argv`` (this process's arguments where none)."""
    return " ".join(["python", "benchmarks/bench_batch.py", *(argv or sys.argv[1:])])
