"""Device, dtype and timing decided once at the edge, then passed down.

All timing goes through :func:`sync` so that GPU work is finished before a clock is read (A.8).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

_SYNC = None


def set_sync(fn) -> None:
    """Install the device's synchronize function (None on CPU)."""
    global _SYNC
    _SYNC = fn


def sync() -> None:
    if _SYNC is not None:
        _SYNC()


def now() -> float:
    """Synchronize the device, then read a monotonic clock."""
    sync()
    return time.perf_counter()


DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Runtime:
    """``dtype``: the verifier's (and the predictor's); ``drafter_dtype``: the drafter's. Only the
    verifier's argmax decides what Strict SDD commits, so the drafter may run in a cheaper dtype
    without changing any output."""

    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    drafter_dtype: str | None = None

    def torch_dtype(self, which: str = "verifier"):
        import torch

        name = (self.drafter_dtype or self.dtype) if which == "drafter" else self.dtype
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]

    def activate(self) -> None:
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        if self.device.startswith("cuda"):
            set_sync(torch.cuda.synchronize)
        else:
            set_sync(None)


def native_bf16(device: str) -> bool:
    """Whether bfloat16 matrix products run natively (CUDA, or a CPU with AVX512-BF16 or AMX)."""
    if device.startswith("cuda"):
        return True
    import torch

    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # older torch: assume not
        return False


def resolve_runtime(device: str | None = None, dtype: str | None = None, threads: int | None = None,
                    drafter_dtype: str | None = None) -> Runtime:
    """``device``: cpu, cuda, cuda:N or None (cuda when available); ``dtype``: float32, bfloat16,
    float16 or None (bfloat16 on CUDA, float32 on CPU); ``drafter_dtype``: as ``dtype``, ``auto``
    or None (bfloat16 where it runs natively, else the verifier's dtype)."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {device!r}; expected cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r}; expected cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is available")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    if dtype is None:
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected float32, bfloat16 or float16")
    if drafter_dtype in (None, "auto"):
        drafter_dtype = "bfloat16" if native_bf16(device) else dtype
    if drafter_dtype not in DTYPES:
        raise ValueError(f"unknown drafter dtype {drafter_dtype!r}; expected auto, float32, bfloat16 or float16")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    return Runtime(device=device, dtype=dtype, threads=threads, drafter_dtype=drafter_dtype)
