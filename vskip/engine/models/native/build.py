"""Compiling the native runtime's kernels for the CPU they run on, once, and loading them.

``kernels.cpp`` is one forward written over the vector operations of ``simd.h``, which has a
section per instruction set. A *variant* is one of those sections built with the compiler flags
of its ISA level:

===============  ==============================================  ====================================
variant          CPUs                                            needs (``/proc/cpuinfo`` flags)
===============  ==============================================  ====================================
``amx``          Intel Sapphire Rapids and later servers         avx512vnni's + amx_tile, amx_int8
``avx512vnni``   Intel Ice Lake and later servers, AMD Zen 4+    x86-64-v4 + avx512_vnni
``avxvnni``      Intel Alder Lake and later desktops, AMD Zen 5  x86-64-v3 + avx_vnni
``avx2``         x86-64 since Haswell / Zen 1                    x86-64-v3 (AVX2, FMA, F16C, BMI2)
``neon-dotprod`` ARM64 with the dot product (Apple M1+,          asimd + asimddp
                 Graviton 2+, Ampere, Cortex-A76+)
``neon``         any ARM64                                       asimd
``portable``     any CPU a C++17 compiler targets                nothing
===============  ==============================================  ====================================

The best variant this CPU runs is chosen (the order above), unless ``$VSKIP_NATIVE_ISA`` names
another, which is refused in one line where this CPU cannot run it. Every variant computes the
same bits for the same rows (``simd.h`` says why; tests/test_native.py checks it). A build lives
in the cache (``$VSKIP_CACHE/native/<variant>-<key>/``), where the key hashes the sources, the
flags, the compiler and, for a build tuned to this CPU, the CPU's model and flags. It links the
OpenMP runtime torch already loaded, so both share one thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ....environment import cache_root, cxx, malloc_chosen, native_isa
from ....files import DirLock

SOURCES = (Path(__file__).with_name("kernels.cpp"), Path(__file__).with_name("simd.h"))
SOURCE = SOURCES[0]
#: flags every variant builds with: -ffp-contract=off keeps a * b + c two roundings unless written as an FMA
COMMON_FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
ENV = "VSKIP_NATIVE_ISA"

_V3 = ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm")
_V4 = _V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni")


@dataclass(frozen=True)
class Variant:
    name: str
    arch: str  # "x86_64", "aarch64" or "any"
    needs: tuple[str, ...]  # /proc/cpuinfo flags (x86) or Features (ARM64)
    flags: tuple[str, ...]  # compiler flags beyond COMMON_FLAGS
    macro: str

    def define(self) -> str:
        return f"-DVSKIP_ISA_{self.macro}"


#: best first, per architecture
VARIANTS = {v.name: v for v in (
    Variant("amx", "x86_64", _V4 + ("amx_tile", "amx_int8"), ("-march=x86-64-v4", "-mavx512vnni", "-mamx-tile",
                                                                 "-mamx-int8"), "AMX"),
    Variant("avx512vnni", "x86_64", _V4, ("-march=x86-64-v4", "-mavx512vnni"), "AVX512VNNI"),
    Variant("avxvnni", "x86_64", _V3 + ("avx_vnni",), ("-march=x86-64-v3", "-mavxvnni"), "AVXVNNI"),
    Variant("avx2", "x86_64", _V3, ("-march=x86-64-v3",), "AVX2"),
    Variant("neon-dotprod", "aarch64", ("asimd", "asimddp"), ("-march=armv8.2-a+dotprod",), "NEON_DOTPROD"),
    Variant("neon", "aarch64", ("asimd",), ("-march=armv8-a",), "NEON"),
    # plain C++: the compiler may vectorize it for the CPU it builds on (without changing a bit:
    # -ffp-contract=off, no fast-math); std::fma is then one instruction instead of a library call
    Variant("portable", "any", (), ("-march=native",), "PORTABLE"),
)}


class NativeUnavailable(RuntimeError):
    """The native runtime cannot run here (no compiler, or a variant this CPU cannot run)."""


def cpu_flags() -> tuple[str, set[str]]:
    """The CPU's model name and flags, from /proc/cpuinfo (empty where there is none; ARM64's
    ``Features`` line stands for x86's ``flags``)."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model", "CPU part") and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    if not flags and machine_arch() == "aarch64":  # macOS: no /proc; Advanced SIMD is part of ARMv8-A
        flags = {"asimd"} | ({"asimddp"} if _sysctl("hw.optional.arm.FEAT_DotProd") == "1" else set())
        model = model or _sysctl("machdep.cpu.brand_string")
    return model, flags


def _sysctl(key: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def cannot_run(name: str, flags: set[str] | None = None, arch: str | None = None) -> str | None:
    """Why this CPU cannot run variant ``name``, or None when it can."""
    if name not in VARIANTS:
        return f"{name!r} is not a variant of the native runtime (one of {', '.join(VARIANTS)})"
    v = VARIANTS[name]
    arch = arch or machine_arch()
    if v.arch not in ("any", arch):
        return f"the {name} variant runs on {v.arch} CPUs; this one is {arch}"
    here = flags is None
    if here:
        flags = cpu_flags()[1]
    missing = [f for f in v.needs if f not in flags]
    if missing:
        return f"this CPU cannot run the {name} variant: it lacks {', '.join(missing)}"
    if here and "amx_tile" in v.needs and not tiles_granted():
        return (f"this CPU has AMX, but the operating system does not let this process use its tiles "
                f"(Linux grants them from 5.16 on)")
    return None


@lru_cache(maxsize=1)
def tiles_granted() -> bool:
    """Whether Linux lets this process use AMX's tile data (it asks: arch_prctl ARCH_REQ_XCOMP_PERM
    for XFEATURE_XTILEDATA, as every AMX program must once before its first tile instruction)."""
    if sys.platform != "linux" or machine_arch() != "x86_64":
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl on x86-64
    except (OSError, AttributeError):
        return False


def runnable(flags: set[str] | None = None, arch: str | None = None) -> list[str]:
    """The variants this CPU runs, best first (``portable`` always last)."""
    return [n for n in VARIANTS if cannot_run(n, flags, arch) is None]


def parse_variants(text: str | None) -> list[str]:
    """Comma-separated variant names, each checked against this CPU (empty: every one it runs)."""
    names = [v.strip() for v in (text or "").split(",") if v.strip()] or runnable()
    bad = [reason for v in names if (reason := cannot_run(v))]
    if bad:
        raise ValueError("; ".join(bad))
    return names


def chosen_isa() -> str:
    """The variant this process uses: ``$VSKIP_NATIVE_ISA`` where set, else the best this CPU runs."""
    asked = native_isa()
    if asked and asked != "auto":
        reason = cannot_run(asked)
        if reason:
            raise NativeUnavailable(f"{ENV}={asked}: {reason}")
        return asked
    best = runnable()
    if best[0] == "amx" and not _builds("amx"):  # a compiler older than AMX's intrinsics: the next best
        best = best[1:]
    return best[0]


@lru_cache(maxsize=None)
def _builds(name: str) -> bool:
    try:
        library_path(name)
    except NativeUnavailable as e:
        print(f"vskip: the {name} variant of the native kernels does not build here ({str(e).splitlines()[0]}); "
              f"using the next best", file=sys.stderr)
        return False
    return True


def unsupported_reason() -> str | None:
    """Why the native runtime cannot run on this machine (a variant asked for that the CPU cannot
    run, no compiler, or one that cannot build the kernels: built here once, cached), or None."""
    try:
        library_path()
    except NativeUnavailable as e:
        return str(e).splitlines()[0]
    return None


def compiler() -> str:
    return cxx()


def compile_flags(name: str, extra: tuple[str, ...] = ()) -> list[str]:
    v = VARIANTS[name]
    tune = ["-mtune=native"] if v.arch == "x86_64" and machine_arch() == "x86_64" else []
    if "-march=native" in v.flags:
        tune = []
    return [*COMMON_FLAGS, *v.flags, *tune, v.define(), *extra]


@lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def build_key(name: str, extra: tuple[str, ...] = ()) -> str:
    model, flags = cpu_flags()
    version = compiler_version(compiler())
    h = hashlib.sha256()
    parts = [s.read_bytes() for s in SOURCES] + [" ".join(compile_flags(name, extra)).encode(), version.encode()]
    if {"-mtune=native", "-march=native"} & set(compile_flags(name, extra)):
        parts += [model.encode(), " ".join(sorted(flags)).encode()]
    for part in parts:
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def library_path(name: str | None = None, extra: tuple[str, ...] = ()) -> Path:
    """Where this machine's build of variant ``name`` (default: :func:`chosen_isa`) lives, built
    there on first use. ``extra``: more compiler flags (tests build altered variants so)."""
    name = name or chosen_isa()
    reason = cannot_run(name)
    if reason:
        raise NativeUnavailable(reason)
    if not shutil.which(compiler()):
        raise NativeUnavailable(f"the native runtime is compiled on first use and needs a C++ compiler "
                                f"({compiler()} not found; set CXX)")
    out = cache_root() / "native" / f"{name}-{build_key(name, extra)}"
    lib = out / "libvskip_native.so"
    if lib.exists():
        return lib
    with DirLock(out, "the native kernels' build", wait=True):
        if lib.exists():
            return lib
        tmp = out / f"libvskip_native.so.tmp{os.getpid()}"
        print(f"vskip: compiling the native runtime's kernels ({name}) for this CPU (once)", file=sys.stderr)
        flags = compile_flags(name, extra)
        # a compiler without OpenMP (Apple's clang) builds them single-threaded; one that does not
        # know -march=native builds the portable variant for its default target: the same bits either way
        tries = [flags, [f for f in flags if f != "-fopenmp"],
                 [f for f in flags if f not in ("-fopenmp", "-march=native")]]
        for i, attempt in enumerate(dict.fromkeys(tuple(t) for t in tries)):
            cmd = [compiler(), *attempt, "-o", str(tmp), str(SOURCE)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode == 0:
                if "-fopenmp" not in attempt:
                    print("vskip: the C++ compiler has no OpenMP: the native kernels run on one thread",
                          file=sys.stderr)
                break
            if i == 0:
                first = f"compiling the native kernels failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}"
        else:
            raise NativeUnavailable(first)
        tmp.rename(lib)
    return lib


#: glibc's malloc settings (mallopt's numbers) the runtime asks for, unless the environment set
#: them: blocks up to 64 MiB come from the heap, and up to 256 MiB of freed heap is kept. Each
#: forward allocates its logits and scratch afresh (a 5-row verification's logits are 1 MB); by
#: default glibc maps such blocks anew or gives the heap's top back, and every page of the next
#: one faults again. Only where memory sits changes, never a bit.
MALLOC_SETTINGS = {"MALLOC_MMAP_THRESHOLD_": (-3, 64 << 20), "MALLOC_TRIM_THRESHOLD_": (-1, 256 << 20),
                   "MALLOC_TOP_PAD_": (-2, 64 << 20)}


@lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Apply :data:`MALLOC_SETTINGS` once (glibc only; False elsewhere or where the environment
    sets any of them)."""
    if sys.platform != "linux" or malloc_chosen(MALLOC_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(None)
        return all(libc.mallopt(param, value) == 1 for param, value in MALLOC_SETTINGS.values())
    except (OSError, AttributeError):  # not glibc
        return False


@lru_cache(maxsize=None)
def library(name: str | None = None, extra: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The compiled kernels of variant ``name`` (default: :func:`chosen_isa`), loaded (after
    torch, whose OpenMP runtime they share), with freed memory kept for the next forwards
    (:func:`keep_freed_memory`)."""
    import torch  # noqa: F401 - loads the OpenMP runtime the library links

    from .abi import declare

    keep_freed_memory()

    lib = declare(ctypes.CDLL(str(library_path(name, extra))))
    built = lib.vs_isa().decode()
    assert built == (name or chosen_isa()), (built, name)
    return lib
