"""Saving and loading conditioned drafters: vskip's own directories (``drafter.json`` of format
``vskip-conditioned-drafter/1`` + safetensors) and DFlash checkpoints as published (``config.json``
with ``block_size`` and ``dflash_config``'s ``mask_token_id`` and ``target_layer_ids``, and
safetensors named ``fc``, ``hidden_norm``, ``layers.N.*``, ``norm``), read without running any
code from them. Both borrow the verifier's embedding and output head, and both are checked
against the verifier before any decoding: every tapped layer must exist, the widths must match,
and the block must leave room for a draft."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from .backbone import BackboneConfig, read_safetensors_dir, read_safetensors_file
from .conditioned import SPEC_FORMAT, ConditionedLM, ConditionedSpec, default_target_layers

SPEC_FILE = "drafter.json"
WEIGHTS_FILE = "drafter.safetensors"


def _read_json(path: Path) -> dict | None:
    """The JSON object of a file that may be one (None otherwise; a FIFO or a device is never
    opened: the directory's checks refuse it by name)."""
    if not Path(path).is_file():
        return None
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def is_conditioned_dir(path: Path) -> bool:
    d = _read_json(Path(path) / SPEC_FILE)
    return bool(d) and d.get("format") == SPEC_FORMAT


def is_dflash_checkpoint(path: Path) -> bool:
    d = _read_json(Path(path) / "config.json")
    if not d:
        return False
    arch = " ".join(d.get("architectures") or [])
    return "DFlash" in arch or isinstance(d.get("dflash_config"), dict)


def is_conditioned(path: Path | None) -> bool:
    return path is not None and (is_conditioned_dir(path) or is_dflash_checkpoint(path))


def dflash_spec(path: Path) -> ConditionedSpec:
    """The spec of a DFlash checkpoint directory from its ``config.json`` alone."""
    cfg = _read_json(Path(path) / "config.json") or {}
    sub = cfg.get("dflash_config") or {}
    block = cfg.get("block_size", sub.get("block_size"))
    mask = sub.get("mask_token_id", cfg.get("mask_token_id"))
    if block is None or mask is None:
        raise ValueError(f"{path}/config.json: a DFlash checkpoint must give block_size and dflash_config.mask_token_id")
    layers = sub.get("target_layer_ids")
    if layers is None:
        if "num_target_layers" not in cfg:
            raise ValueError(f"{path}/config.json gives neither dflash_config.target_layer_ids nor num_target_layers")
        layers = default_target_layers(int(cfg["num_target_layers"]), int(cfg["num_hidden_layers"]))
    if any(t not in (None, "full_attention") for t in cfg.get("layer_types") or []):
        raise ValueError(f"{path}: sliding-window draft layers are not supported")
    try:
        bb = BackboneConfig.from_hf(cfg)
        return ConditionedSpec(backbone=bb, target_layers=tuple(int(i) for i in layers), block_size=int(block),
                               mask_token_id=int(mask), qk_norm=True, head_dim=cfg.get("head_dim"), max_tail=0,
                               source="dflash", meta={"config": str(Path(path) / "config.json")})
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}/config.json is not a DFlash draft config: missing {e}") from None


def read_spec(path: Path) -> ConditionedSpec:
    path = Path(path)
    if is_conditioned_dir(path):
        return ConditionedSpec.from_json(json.loads((path / SPEC_FILE).read_text()))
    if is_dflash_checkpoint(path):
        return dflash_spec(path)
    raise ValueError(f"{path} is not a conditioned drafter directory")


def check_against_verifier(spec: ConditionedSpec, verifier_cfg: dict, where: Path, gamma: int | None = None) -> None:
    """Refuse, in one line, a drafter that cannot run beside this verifier."""
    n, d = int(verifier_cfg["num_hidden_layers"]), int(verifier_cfg["hidden_size"])
    bad = [i for i in spec.target_layers if i >= n]
    if bad:
        raise ValueError(f"drafter {where} reads verifier layers {bad}, but the verifier has {n} layers (0..{n - 1})")
    if spec.backbone.hidden_size != d:
        raise ValueError(f"drafter {where} has width {spec.backbone.hidden_size}, the verifier {d}: they must match")
    if spec.backbone.vocab_size > int(verifier_cfg["vocab_size"]):
        raise ValueError(f"drafter {where} has a vocabulary of {spec.backbone.vocab_size}, the verifier "
                         f"{verifier_cfg['vocab_size']}")
    if gamma is not None and gamma > spec.max_gamma:
        raise ValueError(f"drafter {where} has block size {spec.block_size}, so it drafts at most {spec.max_gamma} "
                         f"tokens; --gamma {gamma} is more")


def save_conditioned(model: ConditionedLM, out_dir: Path, meta: dict | None = None, dtype=torch.float16) -> Path:
    """``drafter.json`` and ``drafter.safetensors`` (every own tensor, the restricted head's ids;
    never the verifier's embedding or head)."""
    from safetensors.torch import save_file

    from ...files import own_dir, write_atomic

    out_dir = own_dir(out_dir)
    spec = model.spec if meta is None else replace(model.spec, meta={**model.spec.meta, **meta})
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items() if v is not None}
    sd = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in sd.items()}
    write_atomic(out_dir / WEIGHTS_FILE, lambda tmp: save_file(sd, tmp))
    write_atomic(out_dir / SPEC_FILE, json.dumps(spec.to_json(), indent=1))
    return out_dir


def hf_parts(verifier_model) -> tuple[dict, torch.Tensor, torch.Tensor | None]:
    """(config, input embedding, output head or None) of a loaded transformers verifier: what
    :func:`load_conditioned` borrows."""
    out = verifier_model.get_output_embeddings()
    return (verifier_model.config.to_dict(), verifier_model.get_input_embeddings().weight,
            out.weight if out is not None else None)


def load_conditioned(path: Path, verifier_config: dict, embed: torch.Tensor, head: torch.Tensor | None,
                     dtype=torch.float32, device="cpu") -> ConditionedLM:
    """A conditioned drafter (vskip directory or DFlash checkpoint) attached to the verifier's
    embedding ``embed`` and ``head`` (None: tied to the embedding), checked against the verifier's
    config first."""
    path = Path(path)
    spec = read_spec(path)
    check_against_verifier(spec, verifier_config, path)
    if spec.source == "dflash":
        sd = read_safetensors_dir(path)
        sd = {k[len("model."):] if k.startswith("model.") else k: v for k, v in sd.items()}
        for k in ("embed_tokens.weight", "lm_head.weight"):
            sd.pop(k, None)  # borrowed from the verifier in any case
        head_ids = None
    else:
        if not (path / WEIGHTS_FILE).exists():
            raise FileNotFoundError(f"drafter weights {path / WEIGHTS_FILE} are missing")
        sd = read_safetensors_file(path / WEIGHTS_FILE)
        head_ids = sd.get("head_ids")
    with torch.device("meta"):
        model = ConditionedLM(spec, head_ids)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    missing = [m for m in missing if m != "head_ids"]
    if missing or unexpected:
        raise ValueError(f"drafter {path}: missing tensors {missing[:5]}, unexpected {unexpected[:5]}")
    model = model.to(device=device, dtype=dtype)
    model.attach(embed.to(device=device, dtype=dtype), None if head is None else head.to(device=device, dtype=dtype))
    return model.eval()
