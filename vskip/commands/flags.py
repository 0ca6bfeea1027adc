"""The flag groups several commands share, defined once: the policy and decode settings, the
block-length options, the model and placement flags, the single flags many commands take
(``--task``, ``--verifier``, ``--device``, ``--threads``), and the configurations they build."""

from __future__ import annotations

import argparse
import copy

from ..bench.tasks import ALL_TASKS
from ..defaults import DRAFTS, GAMMA, MAX_NEW_TOKENS, MAX_SEED, POLICIES, POLICY_PARAMETERS, PRESETS, SHAPES, STEPS, grows


def bounded(kind, lo, hi):
    """An argparse type: a number of ``kind`` (int or float) in ``[lo, hi]``, finite."""
    import math

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if (kind is float and not math.isfinite(v)) or not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must lie in {lo}..{hi}, got {text}")
        return v

    return parse


#: what ``--gamma-max off`` and ``--trim off`` read as: the setting off, whatever the preset says
OFF = "off"


def or_off(kind):
    """An argparse type: a number of ``kind``, or ``off``."""
    def parse(text: str):
        if text == OFF:
            return OFF
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'} or off, "
                                             f"got {text!r}") from None

    return parse


def add_policy_flags(p: argparse.ArgumentParser, policy: bool = True) -> None:
    g = p.add_argument_group("policy")
    if policy:
        g.add_argument("--policy", choices=POLICIES, help="decoding method (default: the preset's; strict by default)")
    g.add_argument("--preset", choices=tuple(PRESETS), default="default",
                   help="where the method and its shape start from; explicit flags override it: "
                        + "; ".join(f"{k}: {v.help}" for k, v in PRESETS.items()) + " (default: default)")
    g.add_argument("--gamma", type=int, help=f"draft block length (default: the preset's; the study's {GAMMA}, the paper's 32)")
    g.add_argument("--steps", type=int, help=f"diffusion steps per block (default: the preset's; the study's {STEPS}, the paper's 2)")
    add_block_flags(g)
    for key, param in POLICY_PARAMETERS.items():  # declared once, with their help
        if param.flag:
            default = param.default if param.flag_default is ... else param.flag_default
            g.add_argument("--" + key.replace("_", "-"), type=param.type, default=default, help=param.help)
    g.add_argument("--shadow", action=argparse.BooleanOptionalAction, default=True, help="shadow-verify skipped rounds")
    g.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help=f"output budget (default: {MAX_NEW_TOKENS})")
    add_sampling_flags(p)
    g.add_argument("--predictor", help="directory of trained survival predictors (marginal/conditional; with "
                                       "--policy prefix: the prefix model, whose survival then replaces the "
                                       "confidences' product)")
    add_model_flags(p)


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """The verifier's sampling settings (beyond the paper; greedy unless --temperature > 0)."""
    g = p.add_argument_group("sampling (beyond the paper)")
    g.add_argument("--temperature", type=bounded(float, 0.0, 1e6), default=0.0,
                   help="sample from the verifier at this temperature; Strict SDD stays exact in distribution "
                        "(default: 0, greedy)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the smallest set of mass TOP_P (default: 1)")
    g.add_argument("--sample-top-k", type=bounded(int, 0, 1 << 30), default=0,
                   help="sample among the K most likely tokens (0: all; not top-k acceptance, --top-k)")
    g.add_argument("--seed", type=bounded(int, 0, MAX_SEED), default=0,
                   help="seed of the sampled tokens: each prompt and position draws its own number, so a resumed "
                        "run draws what an unbroken one draws (default: 0)")
    g.add_argument("--speculative-sampling", action="store_true",
                   help="the drafter samples its block and a verified round accepts with min(1, p/q), resampling "
                        "from the residual: exact only for a drafter that drafts in one forward (--steps 1, the "
                        "conditioned drafter); accepts more than the default rule, but the text is no longer ar's "
                        "for the same seed (default: off)")


def add_block_flags(g) -> None:
    """Block length per round and trimming (beyond the paper; the preset's unless given)."""
    g.add_argument("--gamma-max", type=or_off(int), metavar="N|off",
                   help="draft a block of this length instead of --gamma when the drafter's copy hint matches at "
                        "least --min-match tokens or the previous block was accepted whole (default: the preset's; "
                        "off where --gamma is at least the preset's)")
    g.add_argument("--min-match", type=int, help="copy-hint match length that earns --gamma-max (default: the preset's)")
    g.add_argument("--trim", type=or_off(float), metavar="T|off",
                   help="verify only the leading drafted tokens with raw confidence >= TRIM (at least one; off: the "
                        "whole block; default: the preset's). Lossless; traces need whole blocks")
    g.add_argument("--drafts", choices=DRAFTS,
                   help="where a Strict SDD or raw confidence round's draft comes from: drafter (every round, the "
                        "paper's) or payoff (each round the copy hint alone, the drafter or the verifier alone, "
                        "whichever the costs measured as it decodes say commits the most tokens per second; Strict SDD "
                        "stays lossless, raw confidence skips on a copied block's odds; default: the preset's)")


def add_model_flags(p: argparse.ArgumentParser, threads_help: str = "torch CPU threads") -> None:
    """The model flags shared by every command that loads the pair (run, generate, sweep)."""
    m = p.add_argument_group("models")
    m.add_argument("--drafter", help="drafter directory (a conditioned drafter you trained with vskip "
                                     "train-conditioned: none ships), or the shipped drafter's name, "
                                     "smollm2-135m-diffusion (default: the preset's)")
    add_verifier_flag(m, help="verifier: a transformers checkpoint directory or a .gguf file, whose blocks the native "
                              "runtime reads as they are (default: the embedded SmolLM2-135M-Instruct)")
    m.add_argument("--copy-prior", default="auto", metavar="auto|off|PATH",
                   help="the drafter's copy prior: auto (the drafter's copy_prior.json if it has one), off, or a file")
    m.add_argument("--reveal", choices=("maskgit_plus", "topk_margin", "entropy"), help="reveal order (default: the drafter's)")
    m.add_argument("--verifier-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the verifier's KV cache (--no-verifier-cache recomputes every call, as the paper measured)")
    add_device_flag(m, help="cpu, cuda or cuda:N: both models, unless placed apart (default: cuda when available)")
    m.add_argument("--drafter-device", metavar="DEVICE", help="the drafter's own device (default: --device)")
    m.add_argument("--verifier-device", metavar="DEVICE|STRATEGY",
                   help="the verifier's own device, or auto, balanced, balanced_low_0 or sequential to spread it over "
                        "several (accelerate's device_map; default: --device)")
    m.add_argument("--max-memory", metavar="DEV=SIZE,...",
                   help="what each device may hold, e.g. 0=40GiB,1=40GiB; a spread verifier uses these devices "
                        "(default: every visible GPU, all it has free)")
    m.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="the verifier's dtype (default: float32 on CPU, bfloat16 on CUDA). Only float32 is lossless on "
                        "a CPU: bfloat16 is faster where the CPU runs it natively (AVX512-BF16, AMX), but it rounds a "
                        "verification of several positions differently from a one-token step, so Strict SDD's text "
                        "departs even from bfloat16 ar's at near-ties (docs/results/speed.md)")
    m.add_argument("--drafter-dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="the drafter's dtype; it never changes what Strict SDD commits (default auto: bfloat16 where "
                        "the device runs it natively, else --dtype)")
    m.add_argument("--runtime", choices=("auto", "native", "transformers"), default="auto",
                   help="what computes the verifier: native (vskip's int8 kernels on the GGUF blocks as they ship, or "
                        "on Q8_0 blocks of a checkpoint; a CPU with AVX512-VNNI; Strict SDD equals its own ar bit for "
                        "bit), transformers (float32 on a CPU: the reference of the committed studies), or auto "
                        "(native where it runs and no --dtype is given; docs/results/runtime.md)")
    add_threads_flag(m, help=threads_help)


# Flags many commands take, each spelled once here; ``p`` is a parser or an argument group, and
# what differs between commands (help, default) comes in as a parameter.

def add_task_flag(p, required: bool = False, default: str | None = None, help: str | None = None) -> None:
    """``--task``: a name of the task registry (:data:`vskip.bench.tasks.ALL_TASKS`); argparse refuses
    any other and lists the names in the help."""
    p.add_argument("--task", required=required, default=default, choices=ALL_TASKS, help=help)


def add_verifier_flag(p, help: str = "verifier: a transformers checkpoint directory or a .gguf file (default: the "
                                        "embedded verifier)") -> None:
    """``--verifier``: the verifier's checkpoint directory or GGUF file."""
    p.add_argument("--verifier", help=help)


def add_device_flag(p, help: str = "cpu, cuda or cuda:N (default: cuda when available)") -> None:
    """``--device``: where the command's models run."""
    p.add_argument("--device", help=help)


def add_threads_flag(p, default: int | None = None, help: str = "torch CPU threads") -> None:
    """``--threads``: torch's CPU threads (None: torch's own choice, unless ``default`` says otherwise)."""
    p.add_argument("--threads", type=int, default=default, help=help)


#: the most sequences one loop decodes side by side (``--batch-size``)
MAX_BATCH = 1024


def add_batch_flag(p) -> None:
    """``--batch-size``: the sequences one loop decodes side by side
    (:func:`vskip.engine.decode.decode_many`), the same flag for every command that decodes
    through it (``run``, ``compare``, ``sweep``, ``calibrate-online sweep``)."""
    p.add_argument("--batch-size", type=bounded(int, 1, MAX_BATCH), default=1,
                   help="decode this many prompts side by side, sharing each verifier forward; every prompt's "
                        "output is batch 1's up to floating-point near-ties (default: 1)")


def with_preset(a, policy: str | None = None) -> argparse.Namespace:
    """A copy of the parsed flags ``a`` with ``--policy`` and the decoding shape (``--drafter``,
    ``--gamma``, ``--gamma-max``, ``--min-match``, ``--trim``, ``--steps``, ``--drafts``) filled from ``--preset``
    where the command line left them out (``policy``: this method's shape, for commands that compare
    several). A ``--gamma`` at least the preset's ``gamma_max`` turns the preset's block growth off;
    ``off`` turns a setting off. Commands without the policy flags keep what they have."""
    a = copy.copy(a)
    if getattr(a, "preset", None) is None:
        return a
    preset = PRESETS[a.preset]
    if hasattr(a, "policy") and a.policy is None:
        a.policy = preset.policy
    shape = preset.shape(policy or getattr(a, "policy", None) or preset.policy, getattr(a, "trace", False),
                         getattr(a, "drafter", None))
    grow = grows(shape["gamma_max"], a.gamma)
    for key, value in shape.items():
        if hasattr(a, key) and getattr(a, key) is None and (key != "gamma_max" or grow):
            setattr(a, key, value)
    return a


def model_config(a):
    """The :class:`vskip.engine.models.config.ModelConfig` of parsed model flags (``--steps`` included;
    :func:`with_preset` already applied)."""
    from ..engine.models.config import ModelConfig

    cp = getattr(a, "copy_prior", None)
    if cp not in (None, "auto", "off", "none"):
        from pathlib import Path

        if Path(cp).exists() and not (Path(cp).is_file() or Path(cp).is_dir()):  # a FIFO would block
            raise ValueError(f"copy prior {cp} is not a regular file")
    return ModelConfig(drafter=a.drafter, verifier=a.verifier, steps=a.steps, reveal=a.reveal,
                       verifier_cache=a.verifier_cache, device=a.device, dtype=a.dtype, threads=a.threads,
                       copy_prior=a.copy_prior, drafter_dtype=a.drafter_dtype, drafter_device=a.drafter_device,
                       verifier_device=a.verifier_device, max_memory=a.max_memory,
                       runtime=getattr(a, "runtime", "auto"))


def decode_config(a):
    """The :class:`vskip.engine.decode.DecodeConfig` of parsed decode and sampling flags
    (:func:`with_preset` already applied)."""
    from ..engine.decode import DecodeConfig

    def on(value):
        return None if value == OFF else value

    return DecodeConfig(gamma=a.gamma, max_new_tokens=a.max_new_tokens, shadow=a.shadow, gamma_max=on(a.gamma_max),
                        min_match=SHAPES["study"]["min_match"] if a.min_match is None else a.min_match,
                        trim=on(a.trim), sampling=sampling(a), drafts=getattr(a, "drafts", None) or "drafter",
                        trace=getattr(a, "trace", False), task=getattr(a, "task", None))


def settings(a, policy_name: str | None = None):
    """The one place parsed flags become a decode's :class:`~vskip.engine.settings.Settings`: the
    preset applied once, every check of the settings run once (``policy_name``: this policy instead
    of ``--policy``, for commands that compare several)."""
    from ..engine.policy import PolicyConfig
    from ..engine.settings import Settings

    a = with_preset(a, policy_name)
    name = policy_name or a.policy
    policy = PolicyConfig.make(
        name, **{k: getattr(a, k) for k, p in POLICY_PARAMETERS.items() if p.flag},
        survival="model" if name == "prefix" and getattr(a, "predictor", None) else "confidence",
    )
    return Settings(policy, decode_config(a), model_config(a), predictor=getattr(a, "predictor", None))


def sampling(a):
    """The :class:`~vskip.engine.policy.sampling.Sampling` of parsed sampling flags (greedy without them)."""
    from ..engine.policy import Sampling

    if not hasattr(a, "temperature"):
        return Sampling()
    if a.temperature == 0 and (a.top_p != 1.0 or a.sample_top_k != 0):
        raise ValueError("--top-p and --sample-top-k shape sampling: give them with --temperature > 0")
    return Sampling(temperature=a.temperature, top_p=a.top_p, top_k=a.sample_top_k, seed=a.seed,
                    speculative=a.speculative_sampling)


def task_ids(text: str | None) -> tuple[str, ...] | None:
    """Task ids of ``--ids`` (None when not given); given but naming none is an error."""
    if text is None:
        return None
    ids = tuple(i.strip() for i in text.split(",") if i.strip())
    if not ids:
        raise ValueError(f"--ids names no task id: {text!r}")
    return ids
