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


@dataclass(frozen=True)
class Runtime:
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None

    def torch_dtype(self):
        import torch

        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.dtype]

    def activate(self) -> None:
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        if self.device.startswith("cuda"):
            set_sync(torch.cuda.synchronize)
        else:
            set_sync(None)


def resolve_runtime(device: str | None = None, dtype: str | None = None, threads: int | None = None) -> Runtime:
    """``device``: cpu, cuda, cuda:N or None (cuda when available); ``dtype``: float32, bfloat16,
    float16 or None (bfloat16 on CUDA, float32 on CPU)."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is available")
    if dtype is None:
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unknown dtype {dtype!r}; expected float32, bfloat16 or float16")
    return Runtime(device=device, dtype=dtype, threads=threads)
