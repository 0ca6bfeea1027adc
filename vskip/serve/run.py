"""Opening a server (the pair through the one door, the worker, the routes) and running it under
uvicorn, with SIGTERM as a graceful stop: new requests are refused, the admitted ones finish up
to ``--shutdown-timeout``, and the process exits 0."""

from __future__ import annotations

import signal
import socket
import sys
import threading
from pathlib import Path

from .app import ServeState, build_app
from .engine import Engine
from .metrics import Metrics


#: seconds between the end of the requests still running at ``--shutdown-timeout`` and uvicorn's
#: own deadline, which cuts what is still open: their last events and ``[DONE]`` are out by then
GRACE = 5.0


def model_name(models) -> str:
    """The served model's name: the verifier directory's name, or the embedded verifier's."""
    from ..engine.models.embedded import EMBEDDED_VERIFIER

    if models.verifier in (None, "", "default", EMBEDDED_VERIFIER):
        return EMBEDDED_VERIFIER
    return Path(models.verifier).resolve().name


def open_state(a, settings, decoder=None) -> ServeState:
    """The server's state from its parsed flags ``a`` and the command line's function ``settings``
    that checks them (every request's flags go through it too; ``decoder``: a pair already opened,
    as tests pass a fake one)."""
    from ..engine.decode import warmup
    from ..engine.prompting import encode_chat
    from ..engine.door import open_decoder
    from ..study.predictor import policy_predictor

    s = settings(a)  # the server's own settings: checked, and the flags each request lays its keys over
    max_gamma = a.max_gamma if a.max_gamma is not None else max(64, s.longest_block)
    if s.longest_block > max_gamma:
        raise ValueError(f"--gamma {s.longest_block} is more than --max-gamma {max_gamma}")
    dec = decoder or open_decoder(s, batch_size=a.max_batch, drafter=True, predictors=policy_predictor)
    drafter = dec.pair.drafter
    if drafter is not None and drafter.max_gamma is not None:
        max_gamma = min(max_gamma, drafter.max_gamma)
    if decoder is None:
        warmup(drafter, dec.pair.verifier, encode_chat(dec.pair.tokenizer, "Hello"), s.longest_block)
    name = a.served_model_name or model_name(s.models)
    metrics = Metrics(name, a.max_batch, max_gamma)
    timeout = a.request_timeout if a.request_timeout and a.request_timeout > 0 else None
    draft_max = None if a.draft_max_batch is None or a.draft_max_batch < 0 else a.draft_max_batch
    engine = Engine(dec.loop(a.max_batch, a.prefill_chunk or None, draft_max, a.prefill_depth or None),
                    dec.pair.tokenizer, metrics, a.max_queue, timeout)
    return ServeState(engine, metrics, a, dec.pair.tokenizer, name, s.decode.max_new_tokens, max_gamma, settings,
                      s.models)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, reuse_port=False)


def make_server(state: ServeState, shutdown_timeout: float, log_level: str = "warning"):
    """The uvicorn server of ``state``'s routes. On SIGTERM (its ``handle_exit``) the worker drains
    at once (a request still arriving gets 503), and ``shutdown_timeout`` seconds later ends what is
    still queued or decoding with a 503, which a stream gets as its last event before ``[DONE]``;
    uvicorn's own deadline comes :data:`GRACE` seconds after that, once those last events are out."""
    import uvicorn
    from sse_starlette.sse import AppStatus

    AppStatus.disable_automatic_graceful_drain()  # running streams finish; uvicorn's deadline ends the rest
    engine = state.engine

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if not engine.draining:
                engine.drain()
                deadline = threading.Timer(shutdown_timeout, engine.end_now)
                deadline.daemon = True
                deadline.start()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(build_app(state), log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=shutdown_timeout + GRACE, lifespan="on")
    return Server(config)


def _runtime(verifier) -> str:
    """What computes the verifier, as results name it (``native avx2``, ``transformers``)."""
    from ..engine.models.native.verifier import NativeVerifier

    return f"native {verifier.net.variant}" if isinstance(verifier, NativeVerifier) else "transformers"


def serve(state: ServeState, sock: socket.socket, shutdown_timeout: float) -> int:
    """Serve ``state`` on ``sock`` until SIGTERM or SIGINT; 0 after a graceful stop."""
    server = make_server(state, shutdown_timeout)
    if threading.current_thread() is threading.main_thread():
        # uvicorn raises the signal again after it stops; a handler of our own makes that a clean exit
        signal.signal(signal.SIGTERM, lambda *_: None)
    host, port = sock.getsockname()[:2]
    engine = state.engine
    print(f"vskip serve: {state.model_name} on http://{host}:{port} (batch {engine.loop.batch_size}, "
          f"queue {engine.max_queue}, policy {engine.loop.policy.name}, verifier {_runtime(engine.loop.models.verifier)})",
          file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    return 0
