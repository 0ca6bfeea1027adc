"""Compiling the native runtime's kernels for the CPU they run on, once, and loading them.

``kernels.cpp`` is compiled with the system's C++ compiler (``$CXX``, else ``g++``) and
``-march=native`` into the cache (``$VSKIP_CACHE/native/<key>/``), where the key hashes the source,
the compiler and the CPU's model and flags: a library built on a CPU with AMX is never loaded on
one without it. It links the OpenMP runtime torch already loaded, so both share one thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from ....environment import cache_root, cxx
from ....files import DirLock

SOURCE = Path(__file__).with_name("kernels.cpp")
#: the CPU flags the kernels use
REQUIRED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]


class NativeUnavailable(RuntimeError):
    """The native runtime cannot run here (no compiler, or a CPU without the instructions it needs)."""


def cpu_flags() -> tuple[str, set[str]]:
    """The CPU's model name and flags, from /proc/cpuinfo (empty where there is none)."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return model, flags


def unsupported_reason() -> str | None:
    """Why the native runtime cannot run on this machine, or None when it can."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the native runtime needs an x86-64 CPU with AVX512-VNNI (this is {platform.machine()})"
    _, flags = cpu_flags()
    missing = [f for f in REQUIRED_FLAGS if f not in flags]
    if missing:
        return f"the native runtime needs a CPU with {', '.join(REQUIRED_FLAGS)}; this one lacks {', '.join(missing)}"
    if not shutil.which(compiler()):
        return f"the native runtime is compiled on first use and needs a C++ compiler ({compiler()} not found; set CXX)"
    return None


def compiler() -> str:
    return cxx()


def build_key() -> str:
    model, flags = cpu_flags()
    try:
        version = subprocess.run([compiler(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), version.encode(), model.encode(),
                 " ".join(sorted(flags)).encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def library_path() -> Path:
    """Where this machine's build of the kernels lives, built there on first use."""
    reason = unsupported_reason()
    if reason:
        raise NativeUnavailable(reason)
    out = cache_root() / "native" / build_key()
    lib = out / "libvskip_native.so"
    if lib.exists():
        return lib
    with DirLock(out, "the native kernels' build", wait=True):
        if lib.exists():
            return lib
        tmp = out / f"libvskip_native.so.tmp{os.getpid()}"
        cmd = [compiler(), *FLAGS, "-o", str(tmp), str(SOURCE)]
        print("vskip: compiling the native runtime's kernels for this CPU (once)", file=sys.stderr)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise NativeUnavailable(f"compiling the native kernels failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
        tmp.rename(lib)
    return lib


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The compiled kernels, loaded (after torch, whose OpenMP runtime they share)."""
    import torch  # noqa: F401 - loads the OpenMP runtime the library links

    from .abi import declare

    return declare(ctypes.CDLL(str(library_path())))
