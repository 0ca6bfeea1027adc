"""``vskip plan``: the memory each device needs for a pair and placement, from the configs alone."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..defaults import GAMMA, MAX_NEW_TOKENS
from .flags import add_device_flag, add_verifier_flag


def register(subparsers) -> None:
    pl = subparsers.add_parser("plan", help="the memory each device needs for a pair and placement, from the configs alone",
                        description="Estimate, per device, the weights, key/value cache, activations and a CUDA reserve "
                                    "of a drafter/verifier pair placed as the flags say, without loading any weight, "
                                    "and say whether it fits. Plans for other machines with --max-memory. "
                                    "Exit status 0 when it fits, 1 when it does not.")
    pl.add_argument("--drafter", help="drafter directory (vskip drafter or Dream checkpoint; default: the embedded drafter)")
    pl.add_argument("--no-drafter", action="store_true", help="plan the verifier alone (ar)")
    add_verifier_flag(pl, help="verifier checkpoint directory (config.json is enough)")
    add_device_flag(pl, help="both models, unless placed apart (default: cuda:0)")
    pl.add_argument("--drafter-device", metavar="DEVICE")
    pl.add_argument("--verifier-device", metavar="DEVICE|STRATEGY",
                    help="a device, or auto, balanced, balanced_low_0 or sequential over the --max-memory devices")
    pl.add_argument("--max-memory", metavar="DEV=SIZE,...",
                    help="capacity of each device, e.g. 0=80GiB or 0=40GiB,1=40GiB (default: what is free here)")
    pl.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="the verifier's (default: bfloat16 on GPUs)")
    pl.add_argument("--drafter-dtype", choices=("float32", "bfloat16", "float16"), help="default: --dtype")
    pl.add_argument("--prompt-tokens", type=int, default=1024, help="longest prompt (default: 1024)")
    pl.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help=f"output budget (default: {MAX_NEW_TOKENS})")
    pl.add_argument("--gamma", type=int, default=GAMMA, help=f"block length (default: {GAMMA}; the paper: 32)")
    pl.add_argument("--verifier-cache", action=argparse.BooleanOptionalAction, default=True,
                    help="--no-verifier-cache: the verifier recomputes the whole sequence every call (the paper)")
    pl.add_argument("--batch-size", type=int, default=1,
                    help="sequences decoded side by side (run --batch-size), each with its own caches (default: 1)")
    pl.add_argument("--out", help="write the plan as JSON here (and the table beside it as .md)")
    pl.set_defaults(fn=cmd_plan, argv=None)


def cmd_plan(a) -> int:
    from ..engine.models.drafter_files import resolve_drafter_dir
    from ..engine.models.verifiers import resolve_verifier_dir
    from ..engine.models.placement import plan_memory
    from ..engine.runtime import STRATEGIES, normalize_device, parse_max_memory
    from ..files import check_output_path, write_atomic, write_json

    if a.out is not None:
        check_output_path(a.out)
        check_output_path(Path(a.out).with_suffix(".md"))
    vdir = resolve_verifier_dir(a.verifier)
    ddir = None if a.no_drafter else resolve_drafter_dir(a.drafter)
    if ddir is not None and not ddir.exists():
        raise FileNotFoundError(f"drafter path {ddir} does not exist")
    for v, flag in ((a.prompt_tokens, "--prompt-tokens"), (a.max_new_tokens, "--max-new-tokens"), (a.gamma, "--gamma"),
                    (a.batch_size, "--batch-size")):
        if v < 1:
            raise ValueError(f"{flag} must be >= 1, got {v}")
    device = a.device or "cuda:0"
    verifier_on = a.verifier_device or device
    if verifier_on not in STRATEGIES:
        verifier_on = normalize_device(verifier_on)
    drafter_on = normalize_device(a.drafter_device or device)
    gpu = verifier_on in STRATEGIES or verifier_on.startswith("cuda")
    dtype = a.dtype or ("bfloat16" if gpu else "float32")
    plan = plan_memory(vdir, ddir, verifier_device=verifier_on, drafter_device=drafter_on, dtype=dtype,
                       drafter_dtype=a.drafter_dtype or dtype, prompt_tokens=a.prompt_tokens,
                       max_new_tokens=a.max_new_tokens, gamma=a.gamma, verifier_cache=a.verifier_cache,
                       capacity=parse_max_memory(a.max_memory), batch=a.batch_size)
    text = plan.describe()
    print(text)
    if a.out is not None:
        command = getattr(a, "command_line", None) or "vskip plan " + " ".join(sys.argv[2:])
        write_json(Path(a.out), {"command": command} | plan.to_json())
        write_atomic(Path(a.out).with_suffix(".md"), f"```\n{command}\n```\n\n{text}\n")
    return 0 if plan.fits else 1
