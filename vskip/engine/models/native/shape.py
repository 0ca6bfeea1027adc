"""What a Llama-family body is made of: its sizes (:class:`Shape`), the one list of families the
native runtime computes (:data:`FAMILIES`) and the one function that turns a transformers-style
config into sizes (:func:`shape_of_config`), which every reader of a checkpoint takes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """The numbers a Llama-family body is made of."""

    n_layers: int
    dim: int
    n_heads: int
    n_kv: int
    head_dim: int
    ffn: int
    vocab: int
    eps: float
    rope_theta: float
    max_positions: int

    def check(self) -> None:
        hd, bad = self.head_dim, []
        sizes = {"layers": self.n_layers, "width": self.dim, "heads": self.n_heads, "key-value heads": self.n_kv,
                 "head size": hd, "feed-forward width": self.ffn, "vocabulary": self.vocab,
                 "context": self.max_positions}
        small = [f"{k} {v}" for k, v in sizes.items() if v < 1]
        if small:
            raise ValueError("the native runtime cannot run this model: " + "; ".join(small) + " (not positive)")
        if hd % 16 or hd > 256:
            bad.append(f"head size {hd} (a multiple of 16 up to 256)")
        if self.n_heads % self.n_kv:
            bad.append(f"{self.n_heads} heads over {self.n_kv} key-value heads")
        for what, n in (("width", self.dim), ("feed-forward width", self.ffn), ("attention width", self.n_heads * hd)):
            if n % 32:
                bad.append(f"{what} {n} (a multiple of 32)")
        if bad:
            raise ValueError("the native runtime cannot run this model: " + "; ".join(bad))


#: every layout a decoder-only config can name, by transformers' ``model_type`` (lower case): whether
#: q, k and v carry biases unless the config says (``attention_bias``), whether each query and key
#: head is RMS-normed before RoPE, and whether the native runtime computes it (Dream is a diffusion
#: drafter of Qwen2's layout, run by the torch body alone).
LAYOUTS = {
    "llama": {"qkv_bias": False, "qk_norm": False, "native": True},
    "mistral": {"qkv_bias": False, "qk_norm": False, "native": True},
    "qwen2": {"qkv_bias": True, "qk_norm": False, "native": True},
    "qwen3": {"qkv_bias": False, "qk_norm": True, "native": True},
    "dream": {"qkv_bias": True, "qk_norm": False, "native": False},
}
#: the families the native runtime computes: the one list (a family added here, in the readers'
#: names and in the kernel)
FAMILIES = {k: v for k, v in LAYOUTS.items() if v["native"]}


def layout_of(cfg: dict) -> dict:
    """The :data:`LAYOUTS` entry of a config (Llama's for a type not listed), with its
    ``attention_bias`` read where it says."""
    lay = dict(LAYOUTS.get(str(cfg.get("model_type", "")).lower(), LAYOUTS["llama"]))
    lay["qkv_bias"] = bool(cfg.get("attention_bias", lay["qkv_bias"]))
    return lay


def family_of(cfg: dict) -> dict:
    kind = cfg.get("model_type")
    if kind not in FAMILIES:
        raise ValueError(f"the native runtime runs {', '.join(sorted(FAMILIES))} models, not {kind!r}")
    return FAMILIES[kind]


def config_sizes(cfg: dict, max_positions: int | None = None) -> Shape:
    """The sizes of any decoder-only transformers ``config.json`` (as a dict), unchecked: the one
    place a config becomes sizes, which the native runtime (:func:`shape_of_config`), the drafter's
    torch body and the memory plan all take."""
    theta = cfg.get("rope_theta")
    if theta is None:
        theta = (cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}).get("rope_theta", 10000.0)
    heads = int(cfg["num_attention_heads"])
    return Shape(int(cfg["num_hidden_layers"]), int(cfg["hidden_size"]), heads,
                 int(cfg.get("num_key_value_heads") or heads),
                 int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads), int(cfg["intermediate_size"]),
                 int(cfg["vocab_size"]), float(cfg.get("rms_norm_eps", 1e-6)), float(theta),
                 int(max_positions or cfg.get("max_position_embeddings") or 2048))


def shape_of_config(cfg: dict, max_positions: int | None = None) -> Shape:
    """:func:`config_sizes` of a config the native runtime computes: families outside
    :data:`FAMILIES`, rope scalings and sliding windows refuse."""
    family_of(cfg)
    for scaling in (cfg.get("rope_scaling") or {}, cfg.get("rope_parameters") or {}):  # transformers 4, 5
        if scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise ValueError(f"the native runtime has no rope scaling {scaling}")
    window = cfg.get("sliding_window")
    applies = cfg.get("use_sliding_window", cfg.get("model_type") == "mistral")  # Qwen's flag; Mistral's always on
    if window and applies and int(window) < int(cfg.get("max_position_embeddings") or 0):
        raise ValueError(f"the native runtime has no sliding-window attention (a window of {window})")
    return config_sizes(cfg, max_positions)


def shape_of_hf(cfg) -> Shape:
    """The Shape of a loaded transformers config object (:func:`shape_of_config` of its dict)."""
    return shape_of_config(cfg.to_dict() if hasattr(cfg, "to_dict") else dict(vars(cfg)))
