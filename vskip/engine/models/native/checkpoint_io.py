"""Reading a transformers checkpoint directory (``config.json`` and ``*.safetensors``, sharded or
not) into the native runtime's Transformer without transformers: the config's sizes through
:func:`~vskip.engine.models.native.model.shape_of_config`, only the tensors the model needs read
from the safetensors files, each checked (present, of the shape the config implies, finite) before
anything reaches :func:`~vskip.engine.models.native.model.from_blocks`. Float matrices become Q8_0
blocks exactly as :func:`~vskip.engine.models.native.model.from_hf_model` makes them from the same
checkpoint loaded by transformers in float32.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .gguf_io import FormatError, check_sizes
from .gguf_io import format_error as _fail
from .model import Transformer, from_blocks
from .shape import Shape, family_of, shape_of_config
from .quant import quantize_q8

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

#: per layer: transformers' module path -> from_blocks' name
MATRICES = {"self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
            "self_attn.o_proj": "o_proj", "mlp.gate_proj": "gate_proj", "mlp.up_proj": "up_proj",
            "mlp.down_proj": "down_proj"}
NORMS = {"input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm"}
QKV_BIASES = {"self_attn.q_proj": "q_bias", "self_attn.k_proj": "k_bias", "self_attn.v_proj": "v_bias"}
QK_NORMS = {"self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm"}
UNBIASED = ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def read_config(directory: Path | str) -> dict:
    """A checkpoint directory's ``config.json`` as a dict (one line naming the file when it is
    missing or not a JSON object)."""
    path = Path(directory) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(path, "missing: a checkpoint directory holds a config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(path, f"not readable JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise _fail(path, "not a JSON object")
    return cfg


def expected_tensors(shape: Shape, cfg: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor name the checkpoint must hold, with its shape (transformers' order) and
    :func:`from_blocks`' name for it."""
    fam = family_of(cfg)
    D, F, V, hd = shape.dim, shape.ffn, shape.vocab, shape.head_dim
    q, kv = shape.n_heads * hd, shape.n_kv * hd
    mats = {"self_attn.q_proj": (q, D), "self_attn.k_proj": (kv, D), "self_attn.v_proj": (kv, D),
            "self_attn.o_proj": (D, q), "mlp.gate_proj": (F, D), "mlp.up_proj": (F, D), "mlp.down_proj": (D, F)}
    out = {"model.embed_tokens.weight": ((V, D), "embed"), "model.norm.weight": ((D,), "norm")}
    if not cfg.get("tie_word_embeddings", False):
        out["lm_head.weight"] = ((V, D), "head")
    for i in range(shape.n_layers):
        p = f"model.layers.{i}"
        for m, dims in mats.items():
            out[f"{p}.{m}.weight"] = (dims, f"layers.{i}.{MATRICES[m]}")
        for m, key in NORMS.items():
            out[f"{p}.{m}.weight"] = ((D,), f"layers.{i}.{key}")
        if fam["qkv_bias"] or cfg.get("attention_bias"):
            for m, n in (("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)):
                out[f"{p}.{m}.bias"] = ((n,), f"layers.{i}.{QKV_BIASES[m]}")
        if fam["qk_norm"]:
            for m, key in QK_NORMS.items():
                out[f"{p}.{m}.weight"] = ((hd,), f"layers.{i}.{key}")
    return out


def _unbiased_check(directory: Path, cfg: dict, shape: Shape, names: set[str]) -> None:
    """Refuse a model with biases where the kernels have none: o_proj (``attention_bias`` outside
    Qwen2, whose attention has them on q, k and v alone), the MLP (``mlp_bias``), or such a bias in
    the files, and q, k or v biases the config says the model lacks."""
    kind = cfg.get("model_type")
    config_biased = {"self_attn.o_proj": bool(cfg.get("attention_bias")) and kind in ("llama", "qwen3"),
                     "mlp.gate_proj": bool(cfg.get("mlp_bias")), "mlp.up_proj": bool(cfg.get("mlp_bias")),
                     "mlp.down_proj": bool(cfg.get("mlp_bias"))}
    for i in range(shape.n_layers):
        for m in UNBIASED:
            if config_biased[m] or f"model.layers.{i}.{m}.bias" in names:
                raise _fail(directory, f"the native runtime has no bias on layer {i} {m.split('.')[-1]}; "
                                       "use --runtime transformers")
    if not (family_of(cfg)["qkv_bias"] or cfg.get("attention_bias")):
        for i in range(shape.n_layers):
            for m in QKV_BIASES:
                if f"model.layers.{i}.{m}.bias" in names:
                    raise _fail(directory, "a bias the config says the model has not (no attention_bias)",
                                f"model.layers.{i}.{m}.bias")


def _weight_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it: the index's weight map, ``model.safetensors``,
    or else every ``*.safetensors`` of the directory (a name in two of them refuses)."""
    index = directory / INDEX
    if index.exists():
        try:
            wm = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise _fail(index, f"not a readable index ({e})") from None
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise _fail(index, "holds no weight_map of tensor names to files")
        out = {}
        for name, file in wm.items():
            p = directory / file
            if Path(file).name != file or not p.is_file():
                raise _fail(index, f"names a weight file {file!r} that the directory lacks", name)
            out[name] = p
        return out
    files = [directory / SINGLE] if (directory / SINGLE).is_file() else sorted(directory.glob("*.safetensors"))
    if not files:
        raise _fail(directory, "no model.safetensors (nor an index of shards) in the checkpoint directory")
    from safetensors import safe_open

    out = {}
    for p in files:
        try:
            with safe_open(str(p), framework="pt") as f:
                keys = list(f.keys())
        except Exception as e:  # noqa: BLE001 - safetensors' own error type: a damaged file
            raise _fail(p, f"not a readable safetensors file ({' '.join(str(e).split())})") from None
        for k in keys:
            if k in out:
                raise _fail(p, f"also in {out[k].name}", k)
            out[k] = p
    return out


def read_tensors(directory: Path, want: dict[str, tuple[tuple[int, ...], str]], files: dict[str, Path]) -> dict:
    """The tensors ``want`` names, as float32, each checked (present, of its shape, a float dtype, finite)."""
    from safetensors import safe_open

    missing = [n for n in want if n not in files]
    if missing:
        more = f" ({len(missing) - 1} more are missing)" if len(missing) > 1 else ""
        raise _fail(directory, f"missing from the checkpoint, which its config.json implies{more}", missing[0])
    by_file: dict[Path, list[str]] = {}
    for n in want:
        by_file.setdefault(files[n], []).append(n)
    out = {}
    for p, names in by_file.items():
        try:
            with safe_open(str(p), framework="pt") as f:
                present = set(f.keys())
                for n in names:
                    if n not in present:
                        raise _fail(p, "missing from the file its index names", n)
                    shape = tuple(f.get_slice(n).get_shape())
                    if shape != want[n][0]:
                        raise _fail(p, f"shape {list(shape)}, but config.json makes it {list(want[n][0])}", n)
                    t = f.get_tensor(n)
                    if t.dtype not in FLOAT_DTYPES:
                        raise _fail(p, f"dtype {t.dtype}, not a float type the native runtime quantizes", n)
                    t = t.float()
                    bad = int(t.numel() - torch.isfinite(t).sum())
                    if bad:
                        raise _fail(p, f"{bad} of its {t.numel()} values are NaN or infinite", n)
                    out[n] = t
        except FormatError:
            raise
        except Exception as e:  # noqa: BLE001 - safetensors' own error type: a damaged file
            raise _fail(p, f"not a readable safetensors file ({' '.join(str(e).split())})") from None
    return out


def load_checkpoint(path_dir: Path | str, threads: int | None = None) -> Transformer:
    """The Transformer of a transformers checkpoint directory (Llama, Mistral, Qwen2, Qwen3: the
    families of :data:`~vskip.engine.models.native.model.FAMILIES`), its float matrices as Q8_0
    blocks: the same weights as :func:`from_hf_model` of the checkpoint loaded in float32."""
    directory = Path(path_dir)
    cfg = read_config(directory)
    files = _weight_files(directory)
    try:
        shape = shape_of_config(cfg)
        check_sizes(shape, len(files), directory / "config.json", "it")
        shape.check()
    except FormatError:
        raise
    except ValueError as e:
        raise _fail(directory / "config.json", str(e)) from None
    except KeyError as e:
        raise _fail(directory / "config.json", f"no {e}, which the native runtime needs") from None
    except (TypeError, ArithmeticError, AttributeError) as e:  # a value of the wrong type, a zero count
        raise _fail(directory / "config.json", f"a malformed config ({type(e).__name__}: {e})") from None
    want = expected_tensors(shape, cfg)
    _unbiased_check(directory, cfg, shape, set(files))
    raw = read_tensors(directory, want, files)
    tensors: dict = {}
    try:
        for name, (dims, key) in want.items():
            t = raw.pop(name)
            if len(dims) == 2 and key != "embed":
                tensors[key] = quantize_q8(t, name)
            else:
                tensors[key] = t.contiguous()
        if "head" not in tensors:  # tied: the head is the embedding
            tensors["head"] = quantize_q8(tensors["embed"], "model.embed_tokens.weight (the tied head)")
    except ValueError as e:
        raise _fail(directory, str(e)) from None
    return from_blocks(shape, tensors, threads)
