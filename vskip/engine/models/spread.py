"""The verifier spread over several devices: accelerate's device map computed from the config alone
(an empty model on the meta device), and its weights, cache and activations added to each
device's use in the memory plan (:mod:`.placement`, whose ``Shape`` and ``DeviceUse`` the
functions here take)."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path



def _accelerate_key(dev: str):
    return int(dev[5:]) if dev.startswith("cuda:") else dev


@contextlib.contextmanager
def _quiet_accelerate():
    """accelerate warns about every GPU a plan names that this machine lacks; a plan is made for
    other machines on purpose."""
    log = logging.getLogger("accelerate")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            yield
    finally:
        log.setLevel(old)


def empty_model(verifier_dir: Path, dtype: str):
    """The verifier as an empty model on the meta device (no weights read, no memory)."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(verifier_dir, trust_remote_code=False, local_files_only=True)
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype), trust_remote_code=False)


def spread(verifier_dir: Path, shape, strategy: str, budget: dict[str, int], dtype: str) -> dict[str, str]:
    """accelerate's device map of the verifier over ``budget`` (bytes for weights per device)."""
    import torch
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    model = empty_model(verifier_dir, dtype)
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    mm = {_accelerate_key(d): max(int(b), 0) for d, b in budget.items()}
    tdt = getattr(torch, dtype)
    with _quiet_accelerate():
        if strategy in ("auto", "balanced", "balanced_low_0") and len(mm) > 1:
            mm = get_balanced_memory(model, max_memory=mm, no_split_module_classes=no_split, dtype=tdt,
                                     low_zero=strategy == "balanced_low_0")
        dmap = infer_auto_device_map(model, max_memory=mm, no_split_module_classes=no_split, dtype=tdt)
    return {k: (f"cuda:{v}" if isinstance(v, int) else str(v)) for k, v in dmap.items()}


def _module_bytes(name: str, shape, nbytes: int) -> tuple[int, int]:
    """(weight bytes, decoder layers) of one entry of a device map."""
    if name in ("", "model"):
        return shape.params * nbytes, shape.layers
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        if len(parts) == i + 1:
            return shape.layers * shape.layer_params * nbytes, shape.layers
        return shape.layer_params * nbytes, 1
    if parts[-1] == "embed_tokens":
        return shape.embed_params * nbytes, 0
    if parts[-1] == "lm_head":
        return shape.head_params * nbytes, 0
    if parts[-1] == "norm":
        return shape.hidden * nbytes, 0
    return 0, 0


def spread_verifier(verifier_dir: Path, vshape, strategy: str, devices: dict, names: list[str],
                     dtype: str, tokens: int, verifier_cache: bool, v_act: int, problems: list[str]) -> dict[str, str]:
    """accelerate's map of a verifier spread over ``devices``, added to their use. Weights get what
    is left after the reserves, the drafter and one forward's activations, scaled so that each
    placed layer's share of the cache fits beside it."""
    vb = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    per_layer_cache = vshape.cache_bytes(tokens, vb, layers=1) if verifier_cache else 0
    scale = vshape.layer_params * vb / (vshape.layer_params * vb + per_layer_cache)
    budget = {}
    for d, u in devices.items():
        if u.capacity is None:
            raise ValueError(f"the capacity of {d} is unknown; give it with --max-memory")
        left = u.capacity - u.total - max(v_act - u.activations, 0)
        budget[d] = int(max(left, 0) * scale)
    vmap = spread(verifier_dir, vshape, strategy, budget, dtype)
    for d in sorted(set(vmap.values())):
        if d == "disk" or d not in devices:
            problems.append(f"the verifier does not fit on {', '.join(names)}: accelerate would offload "
                            f"{sum(1 for v in vmap.values() if v == d)} module(s) to {d}")
    layers_on: dict[str, int] = {}
    for module, d in vmap.items():
        if d not in devices:
            continue
        w, n = _module_bytes(module, vshape, vb)
        devices[d].weights += w
        devices[d].cache += vshape.cache_bytes(tokens, vb, layers=n) if verifier_cache else 0
        layers_on[d] = layers_on.get(d, 0) + n
    for d, n in layers_on.items():
        devices[d].activations = max(devices[d].activations, v_act)
        devices[d].holds.append(f"verifier ({n} of {vshape.layers} layers)")
    return vmap
