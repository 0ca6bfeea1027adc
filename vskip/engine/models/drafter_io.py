"""Building, saving and loading drafters: a drafter made from the verifier's own layers (the
start of self-distillation), a vskip drafter directory (``drafter.json`` + safetensors, stored as
its difference to the verifier), and Dream/DiffuCoder checkpoints, read without running any code
from them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

from .backbone import BackboneConfig, read_hf_config, read_safetensors_file
from .diffusion_lm import SPEC_FILE, WEIGHTS_FILE, DiffusionLM, DrafterSpec

# -- building and loading ------------------------------------------------------------------------


def _strip(prefix: str, sd: dict) -> dict:
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def backbone_state_from_hf(path: Path, num_layers: int, layers: Sequence[int] | None = None,
                           device: str = "cpu") -> dict[str, torch.Tensor]:
    """Embedding, decoder layers and the final norm of a Llama/Qwen2/Dream checkpoint directory,
    renamed to :class:`Backbone` names. The layers are the first ``num_layers``, or ``layers`` (the
    checkpoint's layer ``layers[i]`` becomes layer ``i``)."""
    src = {int(j): i for i, j in enumerate(layers)} if layers is not None else {j: j for j in range(num_layers)}

    def keep(k: str) -> bool:
        if not k.startswith("model."):
            return k == "lm_head.weight"
        parts = k.split(".")
        return parts[1] != "layers" or int(parts[2]) in src

    from .source import float_tensors

    sd = float_tensors(path, keep, device=device)
    out = {}
    for k, v in _strip("model.", sd).items():
        parts = k.split(".")
        if parts[0] == "layers":
            parts[1] = str(src[int(parts[1])])
        out[".".join(parts)] = v
    if "lm_head.weight" in sd:
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def drafter_from_verifier(verifier_dir: Path, num_layers: int = 6, head_ids: torch.Tensor | None = None,
                          layers: Sequence[int] | None = None, copy_input: bool = False) -> DiffusionLM:
    """A drafter on the verifier's own layout: its embedding, first ``num_layers`` layers (or the
    verifier layers ``layers``, in order), final norm and tied head, a learned mask embedding
    (initialised to the mean token embedding), block attention. Untrained: the starting point of
    self-distillation."""
    cfg = read_hf_config(verifier_dir)
    if layers is not None:
        layers = tuple(int(i) for i in layers)
        total = int(cfg["num_hidden_layers"])
        if not layers or len(set(layers)) != len(layers) or not all(0 <= i < total for i in layers):
            raise ValueError(f"layers must be distinct indices in 0..{total - 1}, got {list(layers)}")
        num_layers = len(layers)
        if layers == tuple(range(num_layers)):
            layers = None
    bb = BackboneConfig.from_hf(cfg, num_layers=num_layers)
    spec = DrafterSpec(backbone=bb, mask_token_id=None, head="tied", attention="block", base="embedded-verifier",
                       base_layers=layers, copy_input=copy_input)
    model = DiffusionLM(spec, head_ids)
    sd = backbone_state_from_hf(verifier_dir, num_layers, layers)
    sd.pop("lm_head.weight", None)
    missing, unexpected = model.backbone.load_state_dict(sd, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    with torch.no_grad():
        model.mask_embedding.copy_(model.backbone.embed_tokens.weight.mean(0))
    return model


def save_drafter(model: DiffusionLM, out_dir: Path, base_dir: Path | None = None, dtype=torch.float16, meta=None) -> Path:
    """Write ``drafter.json`` and ``drafter.safetensors``. With ``base_dir``, tensors equal to the
    base checkpoint's are left out (only what differs from the verifier ships)."""
    from safetensors.torch import save_file

    from ...files import own_dir, write_atomic

    out_dir = own_dir(out_dir)
    spec = model.spec if meta is None else replace(model.spec, meta={**model.spec.meta, **meta})
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items() if v is not None}
    if base_dir is not None:
        base = backbone_state_from_hf(base_dir, spec.backbone.num_layers, spec.base_layers)
        for k, v in list(sd.items()):
            name = k[len("backbone."):] if k.startswith("backbone.") else None
            if name in base and base[name].shape == v.shape and torch.equal(base[name].to(v.dtype), v):
                del sd[k]
    sd = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in sd.items()}
    write_atomic(out_dir / WEIGHTS_FILE, lambda tmp: save_file(sd, tmp))
    write_atomic(out_dir / SPEC_FILE, json.dumps(spec.to_json(), indent=1))
    return out_dir


def is_dream_checkpoint(path: Path) -> bool:
    p = Path(path) / "config.json"
    if not p.exists():
        return False
    cfg = json.loads(p.read_text())
    arch = " ".join(cfg.get("architectures") or [])
    return cfg.get("model_type", "").lower() == "dream" or "Dream" in arch


def load_drafter_model(path: Path, base_dir: Path | None = None, dtype=torch.float32, device="cpu") -> DiffusionLM:
    """Load a vskip drafter directory (``drafter.json``) or a Dream/DiffuCoder checkpoint directory
    (``config.json`` of model type Dream, safetensors weights) without executing code from it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"drafter path {path} does not exist")
    if (path / SPEC_FILE).exists():
        spec = DrafterSpec.from_json(json.loads((path / SPEC_FILE).read_text()))
        own = read_safetensors_file(path / WEIGHTS_FILE) if (path / WEIGHTS_FILE).exists() else {}
        model = DiffusionLM(spec, own.get("head_ids"))
        sd = {}
        if spec.base is not None:
            if base_dir is None:
                raise ValueError(f"drafter {path} is stored as a difference to {spec.base!r}; its base is needed")
            base = backbone_state_from_hf(base_dir, spec.backbone.num_layers, spec.base_layers)
            sd |= {"backbone." + k: v for k, v in base.items() if k != "lm_head.weight"}
            if spec.head == "lm_head" and "lm_head.weight" in base:
                sd["lm_head.weight"] = base["lm_head.weight"]
        sd |= own
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [m for m in missing if m != "head_ids"]
        if missing or unexpected:
            raise ValueError(f"drafter {path}: missing tensors {missing[:5]}, unexpected {unexpected[:5]}")
    elif is_dream_checkpoint(path):
        cfg = read_hf_config(path)
        mask_id = cfg.get("mask_token_id")
        if mask_id is None:
            gen = path / "generation_config.json"
            mask_id = json.loads(gen.read_text()).get("mask_token_id") if gen.exists() else None
        if mask_id is None:
            raise ValueError(f"{path}: a Dream checkpoint must name its mask_token_id")
        bb = BackboneConfig.from_hf(cfg)
        tied = bool(cfg.get("tie_word_embeddings", False))
        spec = DrafterSpec(
            backbone=bb, mask_token_id=int(mask_id), head="tied" if tied else "lm_head", attention="full",
            reveal="entropy", meta={"source": "dream"},
        )
        # built on the meta device and filled from safetensors in the dtype and on the device it
        # runs in: a 7B drafter never exists in float32, nor twice in memory
        with torch.device("meta"):
            model = DiffusionLM(spec)
        sd = backbone_state_from_hf(path, bb.num_layers, device=str(device))
        state = {("lm_head.weight" if k == "lm_head.weight" else "backbone." + k): v.to(dtype) for k, v in sd.items()}
        if tied:
            state.pop("lm_head.weight", None)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        missing = [m for m in missing if m != "head_ids"]
        if missing or unexpected:
            raise ValueError(f"{path}: missing tensors {missing[:5]}, unexpected {unexpected[:5]}")
    else:
        raise ValueError(f"{path} is neither a vskip drafter ({SPEC_FILE}) nor a Dream checkpoint")
    return model.to(device=device, dtype=dtype).eval()
