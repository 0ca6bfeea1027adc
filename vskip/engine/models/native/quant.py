"""Weights in the kernels' block layout: an unsigned byte per weight, and per block of 32 inputs a
scale ``d`` and, for Q4_1, a minimum ``m``: ``w = d * (q - offset) + m``.

Q4_1 and Q8_0 blocks from a GGUF file are taken as they are (their values are exactly what
llama.cpp multiplies); float weights are quantized to Q8_0 (a scale per block, ``|q| <= 127``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import abi

BLOCK = 32
#: outputs per packed group, and inputs per VNNI lane
GROUP, LANE = 16, 4


@dataclass
class Packed:
    """A weight matrix [N, K] packed for the kernels: ``q`` uint8 [N/16, K/4, 16, 4] (VNNI order:
    16 outputs, 4 consecutive inputs each), or with ``nibbles`` [N/16, K/8, 64] (quads 2i and
    2i + 1 in the low and high nibbles of the same bytes); ``d`` and ``m`` float16 [N/16, K/32, 16]
    (``m`` None for Q8_0, whose ``offset`` is 128)."""

    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None
    N: int
    K: int
    offset: int
    nibbles: bool = False

    def qmat(self) -> abi.QMat:
        return abi.QMat(self.q.data_ptr(), self.d.data_ptr(), self.m.data_ptr() if self.m is not None else None,
                        self.N, self.K, self.offset, int(self.nibbles))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.d, self.m) if t is not None)

    def values(self) -> torch.Tensor:
        """The stored values, uint8 [N, K] (before the offset)."""
        N, K = self.N, self.K
        q = self.q
        if self.nibbles:
            q = torch.stack([q & 0x0F, q >> 4], dim=2)  # [G, K/8, 2, 64]: quads 2i, 2i + 1
        return q.reshape(N // GROUP, K // LANE, GROUP, LANE).permute(0, 2, 1, 3).reshape(N, K)

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix [N, K] these blocks stand for."""
        N, K = self.N, self.K
        q = self.values().float() - self.offset
        d = self.d.float().permute(0, 2, 1).reshape(N, K // BLOCK).repeat_interleave(BLOCK, 1)
        w = q * d
        if self.m is not None:
            w = w + self.m.float().permute(0, 2, 1).reshape(N, K // BLOCK).repeat_interleave(BLOCK, 1)
        return w


def check_shape(N: int, K: int, what: str) -> None:
    if N % GROUP or K % BLOCK:
        raise ValueError(f"{what}: the native runtime needs outputs in multiples of {GROUP} and inputs in "
                         f"multiples of {BLOCK}, not [{N}, {K}]")


def pack(q: np.ndarray, d: np.ndarray, m: np.ndarray | None, offset: int, what: str = "weight") -> Packed:
    """Blocks given row-major (``q`` uint8 [N, K], ``d`` and ``m`` [N, K/32], float16 or exactly
    representable in it) in the kernels' layout; values below 16 (Q4_1) are packed two to a byte."""
    N, K = q.shape
    check_shape(N, K, what)
    assert q.dtype == np.uint8 and d.shape == (N, K // BLOCK), (q.dtype, d.shape)
    qp = q.reshape(N // GROUP, GROUP, K // LANE, LANE).transpose(0, 2, 1, 3)  # [G, K/4, 16, 4]
    nibbles = offset == 0 and int(q.max(initial=0)) < 16 and (K // LANE) % 2 == 0
    if not (nibbles or (offset == 128 and m is None)):  # the two formats the kernels compute (kernels.cpp)
        raise ValueError(f"{what}: the native runtime computes Q4_1-like blocks (values below 16, offset 0) or "
                         f"Q8_0-like ones (offset 128, no minimums), not offset {offset} with values up to "
                         f"{int(q.max(initial=0))}{' and minimums' if m is not None else ''}")
    if nibbles:
        pairs = qp.reshape(N // GROUP, K // (2 * LANE), 2, GROUP * LANE)
        qp = pairs[:, :, 0] | (pairs[:, :, 1] << 4)

    def scales(a):
        return torch.from_numpy(np.ascontiguousarray(
            a.astype(np.float16).reshape(N // GROUP, GROUP, K // BLOCK).transpose(0, 2, 1)))

    return Packed(torch.from_numpy(np.ascontiguousarray(qp, dtype=np.uint8)), scales(d),
                  scales(m) if m is not None else None, N, K, offset, nibbles)


def q8_blocks(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 of a float matrix [N, K]: int8 values (as uint8 + 128) and a scale per block of 32."""
    N, K = w.shape
    check_shape(N, K, "weight")
    b = w.detach().float().reshape(N, K // BLOCK, BLOCK)
    d = (b.abs().amax(-1) / 127.0).half().float()  # the scale as float16 holds it, as GGUF's Q8_0
    q = torch.where(d[..., None] > 0, torch.round(b / d.clamp_min(1e-30)[..., None]), torch.zeros_like(b))
    q = q.clamp(-127, 127).to(torch.int16) + 128
    return q.reshape(N, K).to(torch.uint8).numpy(), d.half().numpy()


def quantize_q8(w: torch.Tensor, what: str = "weight") -> Packed:
    """A float matrix [N, K] as Q8_0 blocks, packed."""
    q, d = q8_blocks(w)
    return pack(q, d, None, 128, what)


# --- GGUF blocks (ggml's layouts, little-endian: block_q4_0 = f16 d, 16 bytes of nibbles; block_q4_1 = f16 d,
# f16 m, 16 bytes of nibbles; block_q8_0 = f16 d, 32 int8. Nibble byte j holds element j low, j + 16 high.)

#: the block layouts read, by ggml type name: a block's fields as a numpy structured dtype
GGUF_BLOCKS = {
    "Q4_0": np.dtype([("d", "<f2"), ("qs", "u1", (16,))]),
    "Q4_1": np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))]),
    "Q8_0": np.dtype([("d", "<f2"), ("qs", "i1", (32,))]),
}
#: the largest |d| whose Q4_0 minimum -8 d a float16 holds (8 d is exact below it: a power-of-two scaling)
Q4_0_MAX_SCALE = 65504.0 / 8


def gguf_block_view(kind: str, raw: np.ndarray, N: int, K: int, what: str = "tensor") -> np.ndarray:
    """The raw bytes of a GGUF tensor of type ``kind`` as blocks [N, K/32] of :data:`GGUF_BLOCKS`'
    dtype (a view, nothing copied); a size that disagrees refuses."""
    if kind not in GGUF_BLOCKS:
        raise ValueError(f"{what}: GGUF tensors of type {kind} are not read by the native runtime "
                         f"(Q4_0, Q4_1, Q8_0, F32, F16, BF16 are)")
    dt = GGUF_BLOCKS[kind]
    if N <= 0 or K <= 0 or K % BLOCK or raw.dtype != np.uint8 or raw.size != N * (K // BLOCK) * dt.itemsize:
        raise ValueError(f"{what}: {raw.size} bytes of type {raw.dtype} are not [{N}, {K}] {kind} blocks")
    return np.ascontiguousarray(raw).reshape(-1).view(dt).reshape(N, K // BLOCK)


def check_block_scales(kind: str, raw: np.ndarray, N: int, K: int, what: str = "tensor") -> None:
    """Refuse blocks whose scale (or Q4_1 minimum) is NaN or infinite, or a Q4_0 scale whose
    minimum -8 d a float16 cannot hold."""
    blk = gguf_block_view(kind, raw, N, K, what)
    for field in ("d", "m") if kind == "Q4_1" else ("d",):
        v = blk[field]
        bad = ~np.isfinite(v)
        if bad.any():
            r, b = (int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{what}: block {b} of row {r} has a {'scale' if field == 'd' else 'minimum'} "
                             f"that is {float(v[r, b])} ({int(bad.sum())} of its {bad.size} blocks are)")
    if kind == "Q4_0":
        big = np.abs(blk["d"].astype(np.float32)) > Q4_0_MAX_SCALE
        if big.any():
            r, b = (int(i) for i in np.argwhere(big)[0])
            raise ValueError(f"{what}: block {b} of row {r} has a Q4_0 scale {float(blk['d'][r, b])} whose minimum "
                             f"-8 d overflows a float16 (|d| up to {Q4_0_MAX_SCALE:g} is read)")


def gguf_blocks(kind: str, raw: np.ndarray, N: int, K: int,
                what: str = "tensor") -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """(q uint8 [N, K], d float16 [N, K/32], m float16 [N, K/32] or None, offset) of a GGUF tensor's
    raw bytes ``raw`` (uint8, N rows of K values) of type ``kind`` (Q4_0, Q4_1 or Q8_0), so that
    ``w = d * (q - offset) + m``: exactly the values llama.cpp multiplies.

    Q4_0 (``w = d * (q - 8)``) becomes Q4_1-like blocks with ``m = -8 d``, exact in float16 (a
    power-of-two scaling) unless it overflows, which refuses; so do NaN or infinite scales and minimums."""
    check_block_scales(kind, raw, N, K, what)
    blk = gguf_block_view(kind, raw, N, K, what)
    d = blk["d"].astype(np.float16)
    if kind == "Q8_0":
        q = (blk["qs"].astype(np.int16) + 128).astype(np.uint8)
        return q.reshape(N, K), d, None, 128
    qs = blk["qs"]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(N, K)  # element j: low nibble of byte j, j + 16: high
    m = blk["m"].astype(np.float16) if kind == "Q4_1" else (d * np.float16(-8)).astype(np.float16)
    return q, d, m, 0


def permute_rows(a: np.ndarray | None, idx: np.ndarray) -> np.ndarray | None:
    return None if a is None else a[idx]


def unrotate_index(n_rows: int, n_head: int) -> np.ndarray:
    """The row order that undoes llama.cpp's conversion permutation of q/k projections (its
    rotary pairs are adjacent; transformers' are half a head apart)."""
    hd = n_rows // n_head
    return np.arange(n_rows).reshape(n_head, hd // 2, 2).swapaxes(1, 2).reshape(-1)
