"""Where each model runs, and a memory plan made from the checkpoints' configs before any weight
loads.

The drafter runs on one device. The verifier runs on one device or is spread over several with
accelerate's ``device_map`` (``auto``, ``balanced``, ``balanced_low_0`` or ``sequential``,
bounded by ``--max-memory``); the plan computes that map from the config alone (an empty model on
the meta device), and the same map is then given to ``from_pretrained``, so what loads is what was
planned.

The estimate per device: weights (parameters x bytes of the dtype they run in), the key/value
cache over the whole budget (prompt + new tokens + one block), the activations of the largest
forward a round makes (the prompt and a block when the cache is kept; the whole sequence at the
budget when it is recomputed every call, as the paper measured), and a fixed reserve per CUDA
device for its context and allocator. It is an estimate: it counts the attention matrix in full
(the math kernel's cost) and no fragmentation beyond the reserve.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime import STRATEGIES, normalize_device
from .ragged import ragged_capacity

#: reserved per CUDA device for its context, the allocator and the kernels' workspaces
CUDA_RESERVE = 1 << 30
#: below this share of a device left free, the plan warns that it is tight
TIGHT = 0.05
GIB = float(1 << 30)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class MemoryPlanError(ValueError):
    """The models cannot fit where they were placed (said in one line, before anything loads)."""


@dataclass(frozen=True)
class Shape:
    """The sizes of a decoder-only transformer (Llama, Qwen2/2.5, Qwen3, Dream), from its config."""

    name: str
    vocab: int
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool = False
    bias: bool = False
    qk_norm: bool = False
    head_rows: int | None = None  # a restricted output head (vskip drafters)
    extra_params: int = 0  # a vskip drafter's mask embedding and copy-hint input
    recompute: bool = False  # re-encodes the whole sequence every call, keeping no cache (Dream)

    @classmethod
    def from_hf(cls, cfg: dict, name: str = "model") -> "Shape":
        from .native.shape import config_sizes, layout_of

        z, lay = config_sizes(cfg), layout_of(cfg)
        return cls(name=name, vocab=z.vocab, hidden=z.dim, inter=z.ffn, layers=z.n_layers, heads=z.n_heads,
                   kv_heads=z.n_kv, head_dim=z.head_dim, tied=bool(cfg.get("tie_word_embeddings", False)),
                   bias=lay["qkv_bias"], qk_norm=lay["qk_norm"],
                   recompute=str(cfg.get("model_type", "")).lower() == "dream")

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden + (q + 2 * kv if self.bias else 0)
        return attn + 3 * self.hidden * self.inter + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        if self.head_rows is not None:
            return self.head_rows * self.hidden
        return 0 if self.tied else self.vocab * self.hidden

    @property
    def params(self) -> int:
        return self.embed_params + self.layers * self.layer_params + self.hidden + self.head_params + self.extra_params

    def cache_bytes(self, tokens: int, nbytes: int, layers: int | None = None) -> int:
        """Keys and values of ``tokens`` positions over ``layers`` (all by default)."""
        n = self.layers if layers is None else layers
        return 2 * n * self.kv_heads * self.head_dim * tokens * nbytes

    def activation_bytes(self, tokens: int, nbytes: int, logits_rows: int) -> int:
        """The peak of one forward over ``tokens`` new positions (one layer's intermediates, the
        attention matrix in full, the residual stream) and ``logits_rows`` float32 logits."""
        per_token = 3 * self.hidden + 2 * (self.heads + self.kv_heads) * self.head_dim + 3 * self.inter
        attn = self.heads * tokens * tokens
        return (tokens * per_token + attn) * nbytes + logits_rows * (self.head_rows or self.vocab) * 4


def _drafter_extra(d: dict, hidden: int) -> int:
    """Parameters of a vskip drafter beyond its backbone and head (:class:`vskip.engine.models.drafter.DiffusionLM`):
    the learned mask embedding, and the copy hint's projection and length embeddings."""
    from .copy import LENGTH_EDGES

    n = hidden if d.get("mask_token_id") is None else 0
    if d.get("target_layers"):  # a conditioned drafter: the fusion of the tapped layers and its norm
        n += len(d["target_layers"]) * hidden * hidden + hidden
    return n + (hidden * hidden + len(LENGTH_EDGES) * hidden if d.get("copy_input") else 0)


def read_shape(path: Path, name: str) -> Shape:
    """The shape of a checkpoint directory: ``config.json`` (transformers layouts, Dream) or a
    vskip drafter's ``drafter.json``."""
    path = Path(path)
    from ...files import check_regular_file

    spec = path / "drafter.json"
    if spec.exists():
        d = json.loads(check_regular_file(spec, "drafter spec").read_text())
        bb = d["backbone"]
        heads = int(bb["num_heads"])
        return Shape(name=name, vocab=int(bb["vocab_size"]), hidden=int(bb["hidden_size"]),
                     inter=int(bb["intermediate_size"]), layers=int(bb["num_layers"]), heads=heads,
                     kv_heads=int(bb["num_kv_heads"]), head_dim=int(bb["hidden_size"]) // heads,
                     tied=d.get("head", "tied") == "tied", bias=bool(bb.get("attention_bias", False)),
                     recompute=d.get("attention") == "full", head_rows=(d.get("meta") or {}).get("head_size"),
                     extra_params=_drafter_extra(d, int(bb["hidden_size"])))
    cfg = path / "config.json"
    if not cfg.exists():
        raise FileNotFoundError(f"no config.json in {path}")
    try:
        data = json.loads(check_regular_file(cfg, "model configuration").read_text())
        return Shape.from_hf(data, name)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{cfg} does not describe a decoder-only transformer: {e}") from None


@dataclass
class DeviceUse:
    device: str
    capacity: int | None
    weights: int = 0
    cache: int = 0
    activations: int = 0
    reserve: int = 0
    holds: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.weights + self.cache + self.activations + self.reserve

    @property
    def free(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.total

    @property
    def verdict(self) -> str:
        if self.capacity is None:
            return "unknown capacity"
        if self.free < 0:
            return "does not fit"
        return "tight" if self.free < TIGHT * self.capacity else "fits"

    def to_json(self) -> dict:
        return {"device": self.device, "capacity": self.capacity, "weights": self.weights, "cache": self.cache,
                "activations": self.activations, "reserve": self.reserve, "total": self.total,
                "holds": self.holds, "verdict": self.verdict}


@dataclass
class MemoryPlan:
    devices: list[DeviceUse]
    verifier_map: dict[str, str] | None  # module -> device, when the verifier is spread
    settings: dict
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems and all(d.verdict != "does not fit" for d in self.devices)

    def refusal(self) -> str:
        """One line saying why the plan cannot run."""
        if self.problems:
            return self.problems[0]
        bad = [d for d in self.devices if d.verdict == "does not fit"]
        parts = [f"{d.device} needs {d.total / GIB:.1f} GiB of {d.capacity / GIB:.1f} GiB ({', '.join(d.holds)})"
                 for d in bad]
        return ("the models do not fit: " + "; ".join(parts) +
                " (see vskip plan; --verifier-device balanced, --max-memory or another --drafter-device may help)")

    def describe(self) -> str:
        s = self.settings
        head = (f"memory plan: verifier {_count(s['verifier']['params'])} parameters in {s['dtype']}"
                + (f", drafter {_count(s['drafter']['params'])} in {s['drafter_dtype']}" if s.get("drafter") else "")
                + f"; {s['tokens']} tokens at most per sequence"
                + (f", {s['batch']} sequences side by side" if s.get("batch", 1) != 1 else "") + "; verifier cache "
                + ("kept" if s["verifier_cache"] else "recomputed every call"))
        lines = [head, "| device | capacity GiB | weights | cache | activations | reserve | total | verdict | holds |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for d in self.devices:
            cap = "?" if d.capacity is None else f"{d.capacity / GIB:.1f}"
            lines.append(f"| {d.device} | {cap} | {d.weights / GIB:.2f} | {d.cache / GIB:.2f} | "
                         f"{d.activations / GIB:.2f} | {d.reserve / GIB:.2f} | {d.total / GIB:.2f} | {d.verdict} | "
                         f"{', '.join(d.holds)} |")
        lines += [f"problem: {p}" for p in self.problems]
        lines.append("verdict: " + ("fits" if self.fits else "refused: " + self.refusal()))
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"fits": self.fits, "settings": self.settings, "devices": [d.to_json() for d in self.devices],
                "verifier_map": self.verifier_map, "problems": self.problems}


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def available_memory(devices) -> dict[str, int | None]:
    """What each device has free now: CUDA's free memory, the host's MemAvailable."""
    out: dict[str, int | None] = {}
    for dev in devices:
        if dev.startswith("cuda"):
            import torch

            out[dev] = int(torch.cuda.mem_get_info(int(dev[5:]))[0]) if torch.cuda.is_available() else None
        else:
            out[dev] = _host_available()
    return out


def _host_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def plan_memory(
    verifier_dir: Path,
    drafter_dir: Path | None,
    *,
    verifier_device: str,
    drafter_device: str | None,
    dtype: str,
    drafter_dtype: str,
    prompt_tokens: int,
    max_new_tokens: int,
    gamma: int,
    verifier_cache: bool = True,
    capacity: dict[str, int | None] | None = None,
    batch: int = 1,
    runtime: str = "transformers",
) -> MemoryPlan:
    """The memory each device needs for this pair and placement (see the module's docstring).
    ``capacity``: bytes per device (``--max-memory``); what is free on this machine otherwise.
    ``batch``: sequences decoded side by side, each with its own caches (the verifier's ragged
    cache holds ``batch`` rows, each of the positions its buffers grow to:
    :func:`ragged_capacity`) and its rows in every forward. ``runtime``: what computes the verifier
    (``native``: its blocks as the file holds them or as Q8_0, float32 slot caches, :func:`_native`)."""
    vshape = read_shape(verifier_dir, "verifier")
    dshape = read_shape(drafter_dir, "drafter") if drafter_dir is not None else None
    vb, db = DTYPE_BYTES[dtype], DTYPE_BYTES[drafter_dtype]
    tokens = prompt_tokens + max_new_tokens + gamma + 1
    split = verifier_device in STRATEGIES
    if split:
        names = list(capacity) if capacity else _visible_gpus()
        if not names:
            raise ValueError(f"--verifier-device {verifier_device} spreads the verifier over the GPUs, but none is "
                             f"visible; name the devices with --max-memory (e.g. 0=40GiB,1=40GiB)")
    else:
        names = [normalize_device(verifier_device)]
    if dshape is not None:
        drafter_device = normalize_device(drafter_device or names[0])
        if drafter_device not in names:
            names.append(drafter_device)
    cap = dict(capacity) if capacity else {}
    missing = [d for d in names if d not in cap]
    if missing:
        cap |= available_memory(missing)
    devices = {d: DeviceUse(d, cap.get(d), reserve=CUDA_RESERVE if d.startswith("cuda") else 0) for d in sorted(names)}
    problems: list[str] = []

    if dshape is not None:
        _drafter(devices[drafter_device], dshape, db, batch, tokens, prompt_tokens + gamma, gamma)
    settings = {
        "verifier": {"path": str(verifier_dir), "params": vshape.params},
        "drafter": {"path": str(drafter_dir), "params": dshape.params} if dshape else None,
        "dtype": "native blocks" if runtime == "native" else dtype, "drafter_dtype": drafter_dtype,
        "verifier_device": verifier_device, "drafter_device": drafter_device if dshape else None,
        "prompt_tokens": prompt_tokens, "max_new_tokens": max_new_tokens, "gamma": gamma, "tokens": tokens,
        "verifier_cache": verifier_cache, **({"batch": batch} if batch != 1 else {}),
        **({"runtime": "native"} if runtime == "native" else {}), "cuda_reserve": CUDA_RESERVE,
    }
    if runtime == "native":  # the verifier on the CPU, beside the drafter
        _native(devices[names[0]], verifier_dir, vshape, dshape, batch, prompt_tokens + gamma + 1, tokens,
                batch * (gamma + 1))
        return MemoryPlan(list(devices.values()), None, settings, problems)
    v_act = batch * vshape.activation_bytes(prompt_tokens + gamma + 1 if verifier_cache else tokens, vb, gamma + 1)
    # every row of the ragged cache holds what its buffers grew to (doubling from the first forward)
    cache_tokens = batch * ragged_capacity(prompt_tokens + gamma + 1, tokens)
    v_cache = vshape.cache_bytes(cache_tokens, vb) if verifier_cache else 0
    vmap = None
    if not split:
        u = devices[names[0]]
        u.weights += vshape.params * vb
        u.cache += v_cache
        u.activations = max(u.activations, v_act)
        u.holds.append("verifier")
    else:
        from .spread import spread_verifier

        vmap = spread_verifier(verifier_dir, vshape, verifier_device, devices, names, dtype, cache_tokens,
                                verifier_cache, v_act, problems)
    return MemoryPlan(list(devices.values()), vmap, settings, problems)


def _drafter(u: DeviceUse, dshape: Shape, db: int, batch: int, tokens: int, query: int, gamma: int) -> None:
    """The drafter's use of its device: weights, each sequence's context cache (none when it
    re-encodes every block), one forward's activations over ``query`` positions (all ``tokens``
    when it re-encodes)."""
    u.weights += dshape.params * db
    u.cache += 0 if dshape.recompute else batch * dshape.cache_bytes(tokens, db)
    u.activations += dshape.activation_bytes(tokens if dshape.recompute else query, db, gamma)
    if batch > 1 and not dshape.recompute:  # a batched forward stacks the rows' caches, padded, and returns them grown
        u.activations += 2 * batch * dshape.cache_bytes(tokens, db)
    u.holds.append("drafter")


def _native(u: DeviceUse, verifier_dir: Path, vshape: Shape, dshape: Shape | None, batch: int, first: int,
            tokens: int, logits_rows: int) -> None:
    """The native runtime's use of the CPU: the verifier's blocks (a GGUF file's as it holds them, a
    checkpoint's as Q8_0, 34 bytes per 32 weights, its embedding float32), each slot's float32 keys
    and values at the capacity the cache's growth rule reaches, one forward's float32 rows; the
    drafter's layers again as Q8_0 (its float weights, which embed its inputs and hold its head, are
    counted as the drafter's)."""
    from .native.cache import capacity_for
    from .source import gguf_file

    f = gguf_file(verifier_dir)
    blocks = (vshape.layers * vshape.layer_params + vshape.head_params) * 34 // 32
    u.weights += f.stat().st_size if f is not None else blocks + vshape.embed_params * 4
    slot = capacity_for(first, tokens, 1 << 62)
    u.cache += batch * vshape.cache_bytes(slot, 4)
    q, kv = vshape.heads * vshape.head_dim, vshape.kv_heads * vshape.head_dim
    row = 2 * vshape.hidden + 2 * q + 2 * kv + 3 * vshape.inter  # the residual, normed, q|k|v, attention, gate|up, act
    u.activations += batch * first * row * 4 + logits_rows * vshape.vocab * 4
    u.holds.append("verifier (native)")
    if dshape is not None:  # its float weights and cache are counted as the drafter's; its layers again as blocks
        u.weights += dshape.layers * dshape.layer_params * 34 // 32
        u.holds.append("drafter layers (native)")


def _visible_gpus() -> list[str]:
    import torch

    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []

