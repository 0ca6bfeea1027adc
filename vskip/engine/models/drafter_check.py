"""A drafter directory checked against the verifier before any weights load (:func:`check_drafter_dir`),
for each kind: a published DFlash checkpoint, vskip's conditioned drafter, vskip's diffusion
drafter, a Dream/DiffuCoder checkpoint. Each reads only configurations and safetensors headers
(:mod:`.checkpoint`), and builds its module on the meta device."""

from __future__ import annotations

import os
from pathlib import Path

from ...files import FileError, check_regular_file
from .checkpoint import (MAX_LAYERS, MAX_WIDTH, compare_shapes, int_field, max_block, meta_shapes, read_config,
                         weights_shapes)


def _names(cfg: dict) -> str:
    arch = cfg.get("architectures")
    return " ".join(a for a in arch if isinstance(a, str)) if isinstance(arch, list) else ""


def is_dflash_config(cfg: dict) -> bool:
    return "DFlash" in _names(cfg) or isinstance(cfg.get("dflash_config"), dict)


def is_dream_config(cfg: dict) -> bool:
    kind = cfg.get("model_type")
    return (isinstance(kind, str) and kind.lower() == "dream") or "Dream" in _names(cfg)


def verifier_limits(vcfg: dict) -> tuple[int, int, int]:
    """(layers, width, vocabulary) of the verifier's configuration."""
    where = "the verifier's config.json"
    return (int_field(where, "num_hidden_layers", vcfg.get("num_hidden_layers"), 1, MAX_LAYERS),
            int_field(where, "hidden_size", vcfg.get("hidden_size"), 1, MAX_WIDTH),
            int_field(where, "vocab_size", vcfg.get("vocab_size"), 1, 1 << 24))


def _hf_fields(where: Path, cfg: dict, width: int | None, layers_field: str = "num_hidden_layers") -> None:
    """The integer fields of a transformers configuration a drafter module is built from."""
    hidden = int_field(where, "hidden_size", cfg.get("hidden_size"), 1, MAX_WIDTH)
    if width is not None and hidden != width:
        raise ValueError(f"{where}: hidden_size {hidden} is not the verifier's width {width}: they must match")
    int_field(where, "intermediate_size", cfg.get("intermediate_size"), 1, MAX_WIDTH)
    int_field(where, layers_field, cfg.get(layers_field), 1, MAX_LAYERS)
    int_field(where, "vocab_size", cfg.get("vocab_size"), 1, 1 << 24)
    heads = int_field(where, "num_attention_heads", cfg.get("num_attention_heads"), 1, hidden)
    if cfg.get("num_key_value_heads") is not None:
        kv = int_field(where, "num_key_value_heads", cfg.get("num_key_value_heads"), 1, heads)
        if heads % kv:
            raise ValueError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    if cfg.get("head_dim") is not None:
        int_field(where, "head_dim", cfg.get("head_dim"), 1, MAX_WIDTH)
    elif hidden % heads:
        raise ValueError(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")


def _layers(where: Path, field: str, layers, total: int) -> tuple[int, ...]:
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"{where}: {field} must be a list of layer indices, got {layers!r}")
    for i, x in enumerate(layers):
        int_field(where, f"{field}[{i}]", x, -(1 << 62), 1 << 62)
        if not 0 <= x < total:
            raise ValueError(f"{where}: {field} names layer {x}, but the verifier has {total} layers (0..{total - 1})")
    out = tuple(layers)
    if len(set(out)) != len(out):
        raise ValueError(f"{where}: {field} names a layer twice: {list(out)}")
    return out


def _one_forward(where: Path, gamma: int | None, steps: int | None, block: int) -> None:
    if steps not in (None, 1):
        raise ValueError(f"drafter {where.parent} drafts its block in one forward; --steps {steps} is for a "
                         "diffusion drafter (give --steps 1)")
    if gamma is not None and gamma > block - 1:
        raise ValueError(f"drafter {where.parent} has block size {block}, so it drafts at most {block - 1} tokens; "
                         f"--gamma {gamma} is more")


def check_dflash_dir(ddir: Path, cfg: dict, vcfg: dict, gamma: int | None, steps: int | None) -> None:
    from .conditioned import ConditionedLM
    from .conditioned_io import dflash_spec

    where = ddir / "config.json"
    n, width, vocab = verifier_limits(vcfg)
    sub = cfg.get("dflash_config", {})
    if not isinstance(sub, dict):
        raise ValueError(f"{where}: dflash_config must be an object, got {sub!r}")
    block = max_block(where, "block_size", cfg.get("block_size", sub.get("block_size")))
    int_field(where, "dflash_config.mask_token_id", sub.get("mask_token_id", cfg.get("mask_token_id")), 0, vocab - 1)
    _hf_fields(where, cfg, width)
    if sub.get("target_layer_ids") is not None:
        _layers(where, "dflash_config.target_layer_ids", sub["target_layer_ids"], n)
    else:
        int_field(where, "num_target_layers", cfg.get("num_target_layers"), 1, n)
        int_field(where, "num_hidden_layers", cfg.get("num_hidden_layers"), 1, n)
    _one_forward(where, gamma, steps, block)
    spec = dflash_spec(ddir)
    expected = meta_shapes(lambda: ConditionedLM(spec))
    files = sorted(ddir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {ddir}")
    shapes, owner = weights_shapes(files)
    found, where_of = {}, {}
    for name, shape in shapes.items():
        short = name[len("model."):] if name.startswith("model.") else name
        if short in ("embed_tokens.weight", "lm_head.weight"):
            continue  # borrowed from the verifier in any case
        if short in found:
            raise FileError(f"tensor {short} is in both {where_of[short]} and {owner[name]} (as {name})")
        found[short], where_of[short] = shape, owner[name]
    compare_shapes(expected, found, where_of, where, optional=("head_ids",))


def check_conditioned_dir(ddir: Path, d: dict, vcfg: dict, gamma: int | None, steps: int | None) -> None:
    import torch

    from .conditioned import ConditionedLM, ConditionedSpec

    where = ddir / "drafter.json"
    n, width, vocab = verifier_limits(vcfg)
    block = max_block(where, "block_size", d.get("block_size"))
    if d.get("mask_token_id") is not None:
        int_field(where, "mask_token_id", d.get("mask_token_id"), 0, vocab - 1)
    _layers(where, "target_layers", d.get("target_layers"), n)
    _backbone(where, d.get("backbone"), width, vocab)
    _one_forward(where, gamma, steps, block)
    try:
        spec = ConditionedSpec.from_json(d)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where} is not a conditioned drafter spec: {e}") from None
    weights = check_regular_file(ddir / "drafter.safetensors", "drafter weights")
    shapes, owner = weights_shapes([weights])
    k = shapes.get("head_ids")
    if k is not None and len(k) != 1:
        raise ValueError(f"{weights}: tensor head_ids must be one list of token ids, has shape {list(k)}")
    head = None if k is None else (lambda: torch.empty(k, dtype=torch.long))
    expected = meta_shapes(lambda: ConditionedLM(spec, None if head is None else head()))
    compare_shapes(expected, shapes, owner, where, optional=("head_ids",))


def _backbone(where: Path, bb, width: int | None, vocab: int | None) -> None:
    """A vskip spec's ``backbone``: integer fields, the verifier's width and vocabulary at most."""
    if not isinstance(bb, dict):
        raise ValueError(f"{where}: backbone must be an object, got {bb!r}")
    hidden = int_field(where, "backbone.hidden_size", bb.get("hidden_size"), 1, MAX_WIDTH)
    if width is not None and hidden != width:
        raise ValueError(f"{where}: backbone.hidden_size {hidden} is not the verifier's width {width}: they must match")
    int_field(where, "backbone.vocab_size", bb.get("vocab_size"), 1, vocab or (1 << 24))
    int_field(where, "backbone.intermediate_size", bb.get("intermediate_size"), 1, MAX_WIDTH)
    int_field(where, "backbone.num_layers", bb.get("num_layers"), 1, MAX_LAYERS)
    heads = int_field(where, "backbone.num_heads", bb.get("num_heads"), 1, hidden)
    kv = int_field(where, "backbone.num_kv_heads", bb.get("num_kv_heads"), 1, heads)
    if heads % kv or hidden % heads:
        raise ValueError(f"{where}: backbone.num_heads {heads} must divide hidden_size {hidden} and be a multiple "
                         f"of num_kv_heads {kv}")


def check_diffusion_dir(ddir: Path, d: dict, vcfg: dict) -> None:
    """vskip's diffusion drafter: its own tensors (the rest comes from the verifier when its
    ``base`` says so, which then fixes its widths)."""
    import torch

    from .diffusion_lm import DiffusionLM, DrafterSpec

    where = ddir / "drafter.json"
    n, width, vocab = verifier_limits(vcfg)
    based = d.get("base") is not None
    _backbone(where, d.get("backbone"), width if based else None, None)
    bb_vocab = d["backbone"]["vocab_size"]
    if d.get("mask_token_id") is not None:
        int_field(where, "mask_token_id", d.get("mask_token_id"), 0, bb_vocab - 1)
    if based and d.get("base_layers") is not None:
        _layers(where, "base_layers", d.get("base_layers"), n)
    elif based:
        int_field(where, "backbone.num_layers", d["backbone"]["num_layers"], 1, n)
    try:
        spec = DrafterSpec.from_json(d)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where} is not a vskip drafter spec: {e}") from None
    weights = ddir / "drafter.safetensors"
    shapes, owner = weights_shapes([check_regular_file(weights, "drafter weights")]) if weights.exists() else ({}, {})
    k = shapes.get("head_ids")
    head = None if k is None else (lambda: torch.empty(k, dtype=torch.long))
    expected = meta_shapes(lambda: DiffusionLM(spec, None if head is None else head()))
    optional = {"head_ids"} | ({k for k in expected if k.startswith("backbone.") or k == "lm_head.weight"}
                               if based else set())
    compare_shapes(expected, shapes, owner, where, optional=optional)


def check_dream_dir(ddir: Path, cfg: dict, vcfg: dict) -> None:
    """A Dream/DiffuCoder checkpoint: its decoder's tensors as the configuration describes them."""
    from .backbone import BackboneConfig
    from .diffusion_lm import DiffusionLM, DrafterSpec

    where = ddir / "config.json"
    _hf_fields(where, cfg, None)
    mask, field = cfg.get("mask_token_id"), "mask_token_id"
    if mask is None and (ddir / "generation_config.json").exists():
        where = ddir / "generation_config.json"
        mask = read_config(where, "generation configuration").get("mask_token_id")
    if mask is None:
        raise ValueError(f"{ddir}: a Dream checkpoint must name its mask_token_id")
    int_field(where, field, mask, 0, cfg["vocab_size"] - 1)
    where = ddir / "config.json"
    tied = bool(cfg.get("tie_word_embeddings", False))
    try:
        bb = BackboneConfig.from_hf(cfg)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where} is not a Dream configuration: {e}") from None
    spec = DrafterSpec(backbone=bb, mask_token_id=mask, head="tied" if tied else "lm_head", attention="full")
    expected = {("model." + k[len("backbone."):] if k.startswith("backbone.") else k): v
                for k, v in meta_shapes(lambda: DiffusionLM(spec)).items()}
    files = sorted(ddir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {ddir}")
    shapes, owner = weights_shapes(files)
    found = {k: v for k, v in shapes.items() if k.startswith("model.") or k == "lm_head.weight"}
    compare_shapes(expected, found, owner, where, optional={"head_ids", "lm_head.weight"} if tied else {"head_ids"})


def check_drafter_dir(ddir: Path, vdir: Path, gamma: int | None = None, steps: int | None = None) -> None:
    """Everything about the drafter directory ``ddir`` that can be checked against the verifier in
    ``vdir`` without loading a weight (see the module's docstring); a no-op for a directory that
    is neither kind (the loader names it)."""
    from .conditioned import SPEC_FORMAT

    ddir = Path(ddir)
    vcfg = read_config(Path(vdir) / "config.json", "verifier configuration")
    for name in ("manifest.json", "copy_prior.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "vocab.json", "added_tokens.json"):
        if os.path.lexists(ddir / name):
            check_regular_file(ddir / name, "drafter file")
    if os.path.lexists(ddir / "drafter.json"):
        spec = read_config(ddir / "drafter.json", "drafter spec")
        if spec.get("format") == SPEC_FORMAT:
            check_conditioned_dir(ddir, spec, vcfg, gamma, steps)
        else:
            check_diffusion_dir(ddir, spec, vcfg)
    elif os.path.lexists(ddir / "config.json"):
        cfg = read_config(ddir / "config.json", "drafter configuration")
        if is_dflash_config(cfg):
            check_dflash_dir(ddir, cfg, vcfg, gamma, steps)
        elif is_dream_config(cfg):
            check_dream_dir(ddir, cfg, vcfg)
