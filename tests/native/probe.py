"""The model-and-calls file that tests/native/probe.cpp reads, and its build and run under an
emulator: how the tests check a variant this machine cannot run (ARM64's, under qemu)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from vskip.engine.models.native.build import COMMON_FLAGS, VARIANTS

NATIVE = Path(__file__).resolve().parents[2] / "vskip" / "engine" / "models" / "native"
PROBE = Path(__file__).with_name("probe.cpp")
CROSS = {"aarch64": ("aarch64-linux-gnu-g++", "qemu-aarch64-static")}


def _put(out: list, a) -> None:
    """Append array ``a``'s bytes, 64-byte aligned (as the reader takes them)."""
    n = sum(len(b) for b in out)
    out.append(b"\0" * (-n % 64))
    out.append(np.ascontiguousarray(a).tobytes())


def _qmat(out: list, p) -> None:
    for v in (p.N, p.K, p.offset, int(p.nibbles), int(p.m is not None)):
        _put(out, np.int32(v))
    _put(out, p.q.numpy())
    _put(out, p.d.numpy())
    if p.m is not None:
        _put(out, p.m.numpy())


def write(path: Path, net, calls: list[tuple[list[int], list[int]]]) -> None:
    """``net`` (a float-embedding Transformer with a head) and calls of (tokens, positions) on one slot."""
    s, out = net.shape, []
    for v in (s.n_layers, s.dim, s.n_heads, s.n_kv, s.head_dim, s.ffn, s.vocab, s.max_positions):
        _put(out, np.int32(v))
    _put(out, np.float32(s.eps))
    for ly in net.layers:
        _put(out, ly.attn_norm.numpy())
        _qmat(out, ly.qkv)
        _put(out, np.int32(ly.qkv_bias is not None))
        if ly.qkv_bias is not None:
            _put(out, ly.qkv_bias.numpy())
        _qmat(out, ly.o)
        _put(out, ly.ffn_norm.numpy())
        _qmat(out, ly.gate_up)
        _qmat(out, ly.down)
    _put(out, np.int32(net.final_norm is not None))
    if net.final_norm is not None:
        _put(out, net.final_norm.numpy())
    _put(out, net.embed.numpy())
    _qmat(out, net.head)
    _put(out, net.rope_cos.numpy())
    _put(out, net.rope_sin.numpy())
    _put(out, np.int32(len(calls)))
    for tokens, positions in calls:
        _put(out, np.int32(len(tokens)))
        _put(out, np.asarray(tokens, dtype=np.int64))
        _put(out, np.asarray(positions, dtype=np.int32))
    path.write_bytes(b"".join(out))


def cross_tools(arch: str) -> tuple[str, str] | None:
    """The cross compiler and emulator for ``arch``, where both are installed."""
    cxx, emu = CROSS[arch]
    return (cxx, emu) if shutil.which(cxx) and shutil.which(emu) else None


def run(variant: str, model_file: Path, out: Path, work: Path) -> tuple[str, np.ndarray]:
    """Build the probe with ``variant``'s kernels (a cross compiler for another architecture,
    static) and run it (under the emulator): (the ISA it reports, the logits it wrote)."""
    v = VARIANTS[variant]
    tools = cross_tools(v.arch) if v.arch in CROSS else None
    cxx, emu = tools if tools else ("g++", None)
    exe = work / f"probe-{variant}"
    flags = [f for f in COMMON_FLAGS if f not in ("-shared", "-fPIC")]
    cmd = [cxx, *flags, *v.flags, v.define(), "-static", f"-I{NATIVE}", "-o", str(exe), str(PROBE)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    runner = [emu, "-cpu", "max"] if emu else []
    done = subprocess.run([*runner, str(exe), str(model_file), str(out)], check=True, capture_output=True, text=True,
                          timeout=600)
    return done.stdout.strip(), np.fromfile(out, dtype=np.float32)
