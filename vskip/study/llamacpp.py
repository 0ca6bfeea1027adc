"""llama.cpp's own decoders as configurations of ``vskip compare``: ``llamacpp`` (``llama-server``'s
greedy decode of the GGUF file the embedded verifier ships as) and ``llamacpp-SPEC`` (its
speculative modes without a draft model: ``ngram-simple``, ``ngram-mod``, ``ngram-map-k``,
``ngram-map-k4v``, ``ngram-cache``).

The server is built from the llama.cpp source the llama-cpp-python sdist vendors, for the CPU it
runs on (``scripts/llamacpp.sh``); ``$VSKIP_LLAMA_SERVER`` names another binary. It runs beside
vskip with the same thread count, one slot, and the prompt as the very token ids vskip decodes;
its clock is its own generation timing (``predicted_ms``: the tokens it generates, not the
evaluation of the prompt, which vskip's clock does include; the comparison leans llama.cpp's way),
with its prompt cache off so that every decode evaluates its prompt alike.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from ..environment import llama_server

#: llama-server's speculative modes that need no draft model
SPEC_TYPES = ("ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache")
PREFIX = "llamacpp"


class LlamaCppMissing(RuntimeError):
    pass


def server_binary() -> Path | None:
    """``$VSKIP_LLAMA_SERVER``, else the build of ``scripts/llamacpp.sh`` for this CPU, else one on PATH."""
    env = llama_server()
    if env:
        return Path(env) if Path(env).exists() else None
    script = Path(__file__).resolve().parents[2] / "scripts" / "llamacpp.sh"
    if script.exists():
        done = subprocess.run(["bash", str(script), "path"], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip():
            p = Path(done.stdout.strip().splitlines()[-1]) / "llama-server"
            if p.exists():
                return p
    found = shutil.which("llama-server")
    return Path(found) if found else None


def check_available(names, verifier: str | None) -> None:
    """Refuse llama.cpp's configurations ``names`` before any model loads: they decode the embedded
    verifier's GGUF file with a built ``llama-server``."""
    from ..engine.models.embedded import EMBEDDED_VERIFIER

    if verifier not in (None, "", "default", EMBEDDED_VERIFIER):
        raise ValueError(f"{', '.join(names)}: llama.cpp's configurations decode the embedded verifier's GGUF file; "
                         "leave them out with --verifier")
    if server_binary() is None:
        raise LlamaCppMissing(f"{', '.join(names)}: llama.cpp's llama-server is not built here: run bash "
                              "scripts/llamacpp.sh (or set VSKIP_LLAMA_SERVER)")


def version(binary: Path) -> str:
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    text = (done.stdout + done.stderr).strip().splitlines()
    return next((line.strip() for line in text if line.strip().startswith("version")), text[-1] if text else "?")


def spec_of(name: str) -> str | None:
    """The speculative mode of a configuration name (None: greedy), or ValueError."""
    if name == PREFIX:
        return None
    mode = name[len(PREFIX) + 1:] if name.startswith(PREFIX + "-") else ""
    if mode not in SPEC_TYPES:
        raise ValueError(f"unknown llama.cpp configuration {name!r}; expected {PREFIX} or "
                         + ", ".join(f"{PREFIX}-{s}" for s in SPEC_TYPES))
    return mode


class LlamaServer:
    """One ``llama-server`` process on a free loopback port, serving one model with ``slots`` slots
    (continuous batching over them), each with a context of ``ctx`` tokens."""

    def __init__(self, gguf: Path, threads: int, spec: str | None = None, ctx: int = 4096, binary: Path | None = None,
                 slots: int = 1):
        self.args = (gguf, threads, spec, ctx)
        self.slots = slots
        self.binary = binary or server_binary()
        if self.binary is None:
            raise LlamaCppMissing("llama.cpp's llama-server is not built here: run bash scripts/llamacpp.sh "
                                  "(or set VSKIP_LLAMA_SERVER)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [str(self.binary), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-c", str(ctx * slots), "-np", str(slots),
               "--host", "127.0.0.1", "--port", str(self.port), "--no-webui"]
        if spec:
            cmd += ["--spec-type", spec]
        self.cmd = cmd
        # its log goes to a file: a pipe nobody reads fills up, and llama-server then blocks writing to it
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        self._wait()

    def _wait(self, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError("llama-server did not become ready in time")

    def complete(self, ids: list[int], max_new: int, eos: set[int], timeout: float = 600.0) -> tuple[list[int], float, dict]:
        """Greedy completion of the token ids ``ids``: (new tokens up to an end-of-sequence
        token, seconds of generation by llama.cpp's own timings, the timings). A server that
        leaves the request unanswered for ``timeout`` seconds raises TimeoutError."""
        body = {"prompt": [int(t) for t in ids], "n_predict": int(max_new), "temperature": 0.0, "top_k": 1,
                "cache_prompt": False, "return_tokens": True, "stream": False, "samplers": ["top_k"]}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                out = json.loads(r.read())
        except (TimeoutError, socket.timeout) as e:
            raise TimeoutError(f"llama-server left a request unanswered for {timeout:.0f} s") from e
        tokens = [int(t) for t in out.get("tokens", [])]
        cut = next((i for i, t in enumerate(tokens) if t in eos), None)
        if cut is not None:
            tokens = tokens[:cut + 1]
        t = out.get("timings", {})
        seconds = float(t.get("predicted_ms", 0.0)) / 1000.0
        return tokens, seconds, t

    def restarted(self) -> "LlamaServer":
        """A new server with the same model and settings, this one stopped."""
        self.close()
        return LlamaServer(*self.args, binary=self.binary, slots=self.slots)

    def log_tail(self, n: int = 1500) -> str:
        return Path(self.log.name).read_text(errors="replace")[-n:]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
