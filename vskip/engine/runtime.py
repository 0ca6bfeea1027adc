"""Device, dtype and timing decided once at the edge, then passed down.

All timing goes through :func:`sync` so that GPU work is finished before a clock is read (A.8).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

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


#: verifier placements that spread it over several devices (accelerate's device-map strategies)
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


@dataclass(frozen=True)
class Runtime:
    """``dtype``: the verifier's (and the predictor's); ``drafter_dtype``: the drafter's. Only the
    verifier's argmax decides what Strict SDD commits, so the drafter may run in a cheaper dtype
    without changing any output.

    ``device`` is where both models run unless ``drafter_device`` or ``verifier_device`` say
    otherwise; ``verifier_device`` may be one of :data:`STRATEGIES`, spreading the verifier over
    the devices of ``max_memory`` (``0=40GiB,1=40GiB``; every visible GPU when not given)."""

    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    drafter_dtype: str | None = None
    drafter_device: str | None = None
    verifier_device: str | None = None
    max_memory: str | None = None
    #: what computes the verifier: ``transformers`` or ``native`` (resolved, never ``auto``)
    verifier_runtime: str = "transformers"

    @property
    def drafter_on(self) -> str:
        return self.drafter_device or self.device

    @property
    def verifier_on(self) -> str:
        """One device, or a strategy of :data:`STRATEGIES`."""
        return self.verifier_device or self.device

    @property
    def verifier_split(self) -> bool:
        return self.verifier_on in STRATEGIES

    def cuda_indices(self) -> list[int]:
        """Every CUDA device a round may use: a timed round synchronises them all (A.8)."""
        import torch

        used = {self.drafter_on}
        if self.verifier_split:
            named = parse_max_memory(self.max_memory) if self.max_memory else None
            used |= set(named) if named else {f"cuda:{i}" for i in range(torch.cuda.device_count())}
        else:
            used.add(self.verifier_on)
        return sorted({0 if d == "cuda" else int(d[5:]) for d in used if d.startswith("cuda")})

    def torch_dtype(self, which: str = "verifier"):
        import torch

        name = (self.drafter_dtype or self.dtype) if which == "drafter" else self.dtype
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]

    def activate(self) -> None:
        import torch

        check_threads(self.threads)
        if self.threads:
            torch.set_num_threads(self.threads)
        idx = self.cuda_indices()
        if idx:
            set_sync(lambda: [torch.cuda.synchronize(i) for i in idx])
        else:
            set_sync(None)


def runtime_name(runtime: Runtime) -> str:
    """The verifier's runtime as results name it: ``native <variant>`` (vskip's int8 kernels on the
    GGUF or Q8_0 blocks, built for this CPU's instruction set: ``native avx2``) or ``transformers <dtype>``."""
    if runtime.verifier_runtime == "native":
        from .models.native.build import chosen_isa

        return f"native {chosen_isa()}"
    return f"transformers {runtime.dtype}"


def native_bf16(device: str) -> bool:
    """Whether bfloat16 matrix products run natively (CUDA, or a CPU with AVX512-BF16 or AMX)."""
    if device.startswith("cuda"):
        return True
    import torch

    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # older torch: assume not
        return False


#: CPU features that change what a model call costs, as /proc/cpuinfo's flags name them: vector
#: width (AVX2, AVX512F), native bfloat16 (AVX512-BF16) and matrix tiles (AMX)
_ISA = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
#: how a machine's name writes them (the three AMX flags as one AMX)
EXTENSIONS = {"avx2": "AVX2", "avx512f": "AVX512F", "avx512_bf16": "AVX512-BF16", "amx_tile": "AMX",
              "amx_bf16": "AMX", "amx_int8": "AMX"}


def machine(runtime: "Runtime | None" = None) -> dict:
    """What the clocks of a run were read on: the CPU model, its cores, the instruction-set
    features that change a model call's cost, the threads a model call uses, the torch and
    transformers versions, and the GPUs the run uses. Two runs timed on different machines cannot
    be compared by their tokens/s."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    import torch

    out = {"cpu": cpu, "cores": os.cpu_count(), "isa": [f for f in _ISA if f in flags],
           "threads": (runtime.threads if isinstance(runtime, Runtime) else None) or torch.get_num_threads()}
    if isinstance(runtime, Runtime):
        out["runtime"] = runtime_name(runtime)
    for name in ("torch", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    gpus = runtime.cuda_indices() if isinstance(runtime, Runtime) else []
    if gpus:
        out["gpus"] = [torch.cuda.get_device_name(i) for i in gpus]
    return out


def machine_id(info: dict) -> str:
    """:func:`machine`'s record as one line a reader can check: the CPU model and the vector
    extensions it has, threads, torch and transformers, GPUs where any. Rows, samples and
    summaries name their machine by it, so two machines are told apart at a glance."""
    ext = list(dict.fromkeys(EXTENSIONS[f] for f in info.get("isa", []) if f in EXTENSIONS))
    parts = [f"{info.get('cpu') or 'unknown CPU'} ({', '.join(ext) if ext else 'no AVX2'})"]
    if info.get("threads"):
        parts.append(f"{info['threads']} thread{'s' if info['threads'] != 1 else ''}")
    elif info.get("cores"):
        parts.append(f"{info['cores']} cores")
    parts += [f"{name} {info[name]}" for name in ("torch", "transformers") if info.get(name)]
    if info.get("runtime"):
        parts.append(f"verifier runtime {info['runtime']}")
    if info.get("gpus"):
        parts.append("GPU " + ", ".join(info["gpus"]))
    return "; ".join(parts)


#: the records behind the ids rows and samples carried before ids were :func:`machine_id`'s line:
#: 12 hex digits of the sha256 of the record as JSON with sorted keys (:func:`legacy_id`)
LEGACY_RECORDS = (
    {"cpu": "AMD EPYC", "cores": 2, "isa": ["avx2"]},
    {"cpu": "Intel(R) Xeon(R) Processor @ 2.60GHz", "cores": 2, "isa": ["avx2", "avx512f"]},
)


def legacy_id(info: dict) -> str:
    """The id an earlier vskip gave ``info``: 12 hex digits of its sha256."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:12]


def machine_name(ident: str | None) -> str | None:
    """The line that names a machine, from an id as rows and samples carry it (an earlier
    vskip's hash is read through :data:`LEGACY_RECORDS`; one not there stays as it is)."""
    if ident is None:
        return None
    for info in LEGACY_RECORDS:
        if legacy_id(info) == ident:
            return machine_id(info)
    return ident


def training_device(device: str | None, flag: str = "--device") -> str:
    """The device a feature extraction or a training runs on: ``device`` checked, or cuda where
    there is one, else cpu."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return _check_device(device, flag)


def _check_device(device: str, flag: str) -> str:
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"{flag}: unknown device {device!r}; expected cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{flag}: unsupported device {device!r}; expected cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{flag} {device} was asked for but no CUDA device is available")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"{flag} {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


#: ``--threads`` may exceed the machine's cores by at most this factor
THREADS_PER_CORE = 4


def check_threads(threads: int | None) -> None:
    """Refuse a thread count below 1 or far above the machine's cores (oversubscription only
    slows every kernel down)."""
    if threads is None:
        return
    most = THREADS_PER_CORE * (os.cpu_count() or 1)
    if not 1 <= threads <= most:
        raise ValueError(f"--threads must lie in 1..{most} ({THREADS_PER_CORE} per core of this machine), got {threads}")


def resolve_runtime(device: str | None = None, dtype: str | None = None, threads: int | None = None,
                    drafter_dtype: str | None = None, drafter_device: str | None = None,
                    verifier_device: str | None = None, max_memory: str | None = None,
                    verifier_runtime: str = "transformers") -> Runtime:
    """``device``: cpu, cuda, cuda:N or None (cuda when available); ``drafter_device``: the
    drafter's own device; ``verifier_device``: the verifier's own device, or a strategy of
    :data:`STRATEGIES` over the devices of ``max_memory``; ``dtype``: float32, bfloat16, float16
    or None (bfloat16 where the verifier runs on CUDA, float32 on CPU); ``drafter_dtype``: as
    ``dtype``, ``auto`` or None (bfloat16 where it runs natively, else the verifier's dtype)."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    _check_device(device, "--device")
    if drafter_device is not None:
        _check_device(drafter_device, "--drafter-device")
    named = None
    if max_memory is not None:
        named = parse_max_memory(max_memory)
        for d in named:
            if d != "cpu":
                _check_device(d, "--max-memory")
    if verifier_device is not None and verifier_device not in STRATEGIES:
        _check_device(verifier_device, "--verifier-device")
    elif verifier_device in STRATEGIES and not named and not torch.cuda.is_available():
        raise ValueError(f"--verifier-device {verifier_device} spreads the verifier over GPUs, but none is "
                         f"available; name the devices with --max-memory (cpu=SIZE on a machine without GPUs)")
    v_on = verifier_device or device
    v_cuda = v_on.startswith("cuda") or (v_on in STRATEGIES and any(d.startswith("cuda") for d in (named or ["cuda"])))
    if dtype is None:
        dtype = "bfloat16" if v_cuda else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected float32, bfloat16 or float16")
    if drafter_dtype in (None, "auto"):
        drafter_dtype = "bfloat16" if native_bf16(drafter_device or device) else dtype
    if drafter_dtype not in DTYPES:
        raise ValueError(f"unknown drafter dtype {drafter_dtype!r}; expected auto, float32, bfloat16 or float16")
    check_threads(threads)
    if verifier_runtime not in ("native", "transformers"):
        raise ValueError(f"unknown verifier runtime {verifier_runtime!r}; expected native or transformers")
    if verifier_runtime == "native" and (v_cuda or v_on in STRATEGIES):
        raise ValueError("the native runtime runs the verifier on a CPU; use --runtime transformers on a GPU")
    return Runtime(device=device, dtype=dtype, threads=threads, drafter_dtype=drafter_dtype,
                   drafter_device=drafter_device, verifier_device=verifier_device, max_memory=max_memory,
                   verifier_runtime=verifier_runtime)


def parse_max_memory(text: str | None) -> dict[str, int] | None:
    """``0=40GiB,1=40GiB,cpu=100GiB`` as ``{"cuda:0": bytes, "cuda:1": bytes, "cpu": bytes}``
    (accelerate's size syntax: GiB/MiB are powers of two, GB/MB of ten)."""
    if text is None:
        return None
    from accelerate.utils import convert_file_size_to_int

    out: dict[str, int] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        dev, sep, size = part.partition("=")
        if not sep:
            raise ValueError(f"--max-memory entries are DEVICE=SIZE (e.g. 0=40GiB,cpu=64GiB), got {part!r}")
        dev = normalize_device(dev.strip())
        try:
            n = convert_file_size_to_int(size.strip())
        except (ValueError, OverflowError):
            raise ValueError(f"--max-memory: {size.strip()!r} is not a size (e.g. 40GiB)") from None
        if n > 1 << 60:  # an exbibyte: no machine's memory
            raise ValueError(f"--max-memory: {size.strip()!r} is larger than any device's memory")
        if n <= 0:
            raise ValueError(f"--max-memory: the size for {dev} must be positive")
        out[dev] = int(n)
    if not out:
        raise ValueError("--max-memory names no device")
    return out


def normalize_device(dev: str) -> str:
    """``0`` and ``cuda:0`` name the same GPU; ``cpu`` the host."""
    dev = str(dev).strip()
    if dev.isdigit():
        return f"cuda:{dev}"
    if dev == "cuda":
        return "cuda:0"
    if dev == "cpu" or (dev.startswith("cuda:") and dev[5:].isdigit()):
        return dev
    raise ValueError(f"unknown device {dev!r}; expected cpu, cuda, cuda:N or N")
