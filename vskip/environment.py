"""The environment variables vskip reads, read here and nowhere else; vskip writes none.

``VSKIP_SANDBOX``
    the sandbox kind that runs generated code (:mod:`vskip.bench.sandbox`): ``auto`` (default),
    ``bubblewrap``, ``namespaces``, ``rlimits`` or ``rlimits-own-uid``.
``VSKIP_CACHE``
    where the embedded verifier, converted from its GGUF file, is cached (default:
    ``$XDG_CACHE_HOME/vskip``, else ``~/.cache/vskip``).
``VSKIP_DEBUG``
    any value but ``0``: a failing command shows its traceback instead of one line.
``CXX``
    the C++ compiler that builds the native runtime's kernels on first use (default ``g++``).
``VSKIP_LLAMA_SERVER``
    the ``llama-server`` binary of ``vskip compare``'s llama.cpp configurations (default: the one
    ``scripts/llamacpp.sh`` built for this CPU, else one on PATH).

``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``
    glibc's own: where any is set, the native runtime leaves malloc's settings as they are
    (:func:`vskip.engine.models.native.build.keep_freed_memory`).

Models are read with ``local_files_only`` (no model hub), not by setting ``HF_HUB_OFFLINE`` for
the whole process. Each reads the environment when called, so a test may set a variable first.
"""

from __future__ import annotations

import os
from pathlib import Path


def sandbox_preference() -> str:
    return os.environ.get("VSKIP_SANDBOX", "auto") or "auto"


def cache_root() -> Path:
    root = os.environ.get("VSKIP_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "vskip"


def debug() -> bool:
    return os.environ.get("VSKIP_DEBUG", "") not in ("", "0")


def cxx() -> str:
    return os.environ.get("CXX") or "g++"


def llama_server() -> str | None:
    return os.environ.get("VSKIP_LLAMA_SERVER") or None


def native_isa() -> str | None:
    """The native runtime's variant asked for by name (``VSKIP_NATIVE_ISA``; None or ``auto``: the CPU's best)."""
    return os.environ.get("VSKIP_NATIVE_ISA", "").strip() or None


def llamacpp_isa() -> str:
    """The ISA level of the llama.cpp build ``scripts/llamacpp.sh`` finds (``LLAMA_CPP_ISA``, default ``native``)."""
    return os.environ.get("LLAMA_CPP_ISA", "").strip() or "native"


def malloc_chosen(names) -> bool:
    """Whether the environment sets any of glibc's malloc variables ``names``."""
    return any(n in os.environ for n in names)
