"""A Llama/Qwen2-layout transformer body written out in plain torch, for the diffusion drafter.

The drafter needs attention patterns a causal LM class does not offer (a causally cached context
followed by a bidirectional block, or full bidirectional attention as Dream uses), and the same
module serves training and inference. Parameter names follow transformers' Llama/Qwen2 modules
(``layers.N.self_attn.q_proj.weight`` ...), so checkpoints load without executing any code.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .attention import spread


@dataclass(frozen=True)
class BackboneConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    attention_bias: bool = False
    #: the head size where a config names one other than the width over the heads (Qwen3)
    head_size: int | None = None
    #: each query and key head RMS-normed before RoPE (Qwen3)
    qk_norm: bool = False

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("head_size", "qk_norm"):  # written only where they say something: older files read the same
            if not d[k]:
                del d[k]
        return d

    @classmethod
    def from_hf(cls, cfg: dict, num_layers: int | None = None) -> "BackboneConfig":
        """From a transformers ``config.json`` of the Llama, Qwen2, Qwen3 or Dream family."""
        from .native.shape import config_sizes, layout_of

        scaling = cfg.get("rope_scaling") or {}
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
            raise ValueError(f"rope scaling {scaling} is not supported by the drafter backbone")
        z, lay = config_sizes(cfg), layout_of(cfg)
        return cls(
            vocab_size=z.vocab, hidden_size=z.dim, intermediate_size=z.ffn,
            num_layers=int(num_layers if num_layers is not None else z.n_layers),
            num_heads=z.n_heads, num_kv_heads=z.n_kv, rms_norm_eps=z.eps, rope_theta=z.rope_theta,
            attention_bias=lay["qkv_bias"], head_size=z.head_dim if z.head_dim * z.n_heads != z.dim else None,
            qk_norm=lay["qk_norm"],
        )

    @classmethod
    def from_json(cls, d: dict) -> "BackboneConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for integer positions (rotate-half convention): [T, head_dim] for positions [T],
    [B, 1, T, head_dim] for per-sequence positions [B, T]."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    ang = positions.float()[..., None] * inv
    emb = torch.cat([ang, ang], dim=-1)
    if positions.ndim == 2:
        emb = emb[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Attention(nn.Module):
    def __init__(self, c: BackboneConfig):
        super().__init__()
        hd = c.head_dim
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * hd, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * hd, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * hd, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * hd, c.hidden_size, bias=False)
        if c.qk_norm:
            self.q_norm = RMSNorm(hd, c.rms_norm_eps)
            self.k_norm = RMSNorm(hd, c.rms_norm_eps)

    def forward(self, x, cos, sin, past, mask, pack=None):
        # x [B, T, d]; cos/sin [T, hd]; past None or (k, v) [B, kvh, P, hd]; mask [T, P+T] bool or None;
        # pack (row, col, rows, width): x is [1, N, d], rows laid end to end (Backbone.forward)
        B, T, _ = x.shape
        hd, h, kvh = self.c.head_dim, self.c.num_heads, self.c.num_kv_heads
        q = self.q_proj(x).view(B, T, h, hd)
        k = self.k_proj(x).view(B, T, kvh, hd)
        if self.c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(B, T, kvh, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if pack is not None:  # attention runs in the padded layout [rows, heads, width, hd]
            row, col, rows, width = pack
            q, k, v = (spread(t, row, col, rows, width) for t in (q, k, v))
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        present = (k, v)
        gqa = kvh != h  # the shared key/value heads are read in place, not repeated
        if isinstance(mask, str):  # "causal": plain causal attention without a cache
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        if pack is not None:
            out = out[row, :, col][None]  # [1, N, h, hd]
        else:
            out = out.transpose(1, 2)
        return self.o_proj(out.reshape(B, T, h * hd)), present


class MLP(nn.Module):
    def __init__(self, c: BackboneConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: BackboneConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, past, mask, pack=None):
        a, present = self.self_attn(self.input_layernorm(x), cos, sin, past, mask, pack)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), present


class Backbone(nn.Module):
    """Embedding, decoder layers and final norm. ``forward`` returns the final-normed hidden
    states (the LM-head input) and the per-layer keys/values of the new positions appended to
    ``past``."""

    def __init__(self, c: BackboneConfig):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, past=None, mask=None, pack=None):
        """embeds [B, T, d]; positions [T] or [B, T]; past: list of (k, v) per layer or None;
        mask: bool [T, P+T] or [B, 1, T, P+T] (True = may attend), None (all attend all) or "causal".

        ``pack`` (row, col, rows, width): the inputs [1, N] are several rows' positions laid end to
        end, position i being column ``col[i]`` of row ``row[i]`` of a padded [rows, width] layout;
        the projections and MLPs compute the N real positions alone, attention runs in the padded
        layout (the mask's and ``past``'s: [rows, 1, width, P + width], [rows, kvh, P, hd]), and the
        keys/values returned are in that layout."""
        assert embeds.ndim == 3 and positions.shape[-1] == embeds.shape[1], (embeds.shape, positions.shape)
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta, embeds.dtype)
        x = embeds
        presents = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, None if past is None else past[i], mask, pack)
            presents.append(kv)
        return self.norm(x), presents


def read_hf_config(path: Path) -> dict:
    p = Path(path) / "config.json"
    if not p.exists():
        raise FileNotFoundError(f"no config.json in {path}")
    return json.loads(p.read_text())


def read_safetensors_dir(path: Path, keep=None, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint directory's safetensors files (sharded or not) whose names pass
    ``keep``, read onto ``device``; only those are read from disk. Never unpickles anything."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {path}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with _named(f):
            with safe_open(str(f), framework="pt", device=device) as st:
                for k in st.keys():
                    if keep is None or keep(k):
                        out[k] = st.get_tensor(k)
    return out


def read_safetensors_file(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one safetensors file; a damaged file is named in the error."""
    from safetensors.torch import load_file

    with _named(path):
        return load_file(str(path))


class _named:
    """Turn safetensors' own errors (a damaged header, a cut file) into one that names the file."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        from safetensors import SafetensorError

        if kind is not None and issubclass(kind, SafetensorError):
            raise ValueError(f"{self.path} is not a readable safetensors file ({err})") from None
        return False
