"""``vskip serve``: an OpenAI-compatible server (``/v1/completions``, ``/v1/chat/completions``) over
the batched decode loop, with the decoding method chosen per request (docs/serve.md)."""

from __future__ import annotations

from .flags import add_policy_flags, bounded, settings


def register(subparsers) -> None:
    s = subparsers.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching")
    add_policy_flags(s)
    g = s.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    g.add_argument("--port", type=bounded(int, 0, 65535), default=8000, help="port (0: a free one; default: 8000)")
    g.add_argument("--max-batch", type=bounded(int, 1, 1024), default=32,
                   help="sequences decoded side by side; new requests join between rounds (default: 32)")
    g.add_argument("--prefill-chunk", type=bounded(int, 0, 1 << 20), default=256,
                   help="prompt tokens read per round, first come first; a long prompt is read over several rounds "
                        "while the running requests keep decoding (0: a prompt is read whole in its first round; "
                        "default: 256)")
    g.add_argument("--prefill-depth", type=bounded(int, 0, 1 << 24), default=0,
                   help="a chunk that starts at depth d counts each of its tokens 1 + d/DEPTH against "
                        "--prefill-chunk, so deep in a long prompt a round reads fewer tokens (its tokens attend "
                        "to more keys; 1024 suits the native runtime on a CPU); 0: every token counts 1 (default)")
    g.add_argument("--draft-max-batch", type=bounded(int, -1, 1 << 20), default=1,
                   help="Strict SDD drafts only in rounds of at most this many decoding sequences; in a fuller round "
                        "the verifier checks its own next token, which leaves the text as it is (-1: always draft; "
                        "default: 1)")
    g.add_argument("--max-queue", type=bounded(int, 0, 1 << 20), default=64,
                   help="requests that may wait for a slot; one more is answered 429 at once (default: 64)")
    g.add_argument("--request-timeout", type=bounded(float, 0.0, 1e7), default=600.0,
                   help="seconds from a request's arrival to its last token; past it the request ends with an "
                        "error and frees its slot (0: none; default: 600)")
    g.add_argument("--shutdown-timeout", type=bounded(float, 0.0, 1e7), default=30.0,
                   help="on SIGTERM, seconds the running requests may take to finish (default: 30)")
    g.add_argument("--max-gamma", type=bounded(int, 1, 4096),
                   help="the longest block a request's vskip object may ask for (default: 64, or --gamma if longer)")
    g.add_argument("--served-model-name", help="the model id clients name (default: the verifier's directory name)")
    # a server runs no forward a client does not need: shadow verification (which recovers L on a
    # skipped round for the studies) is off unless the server or a request's vskip object asks for it
    s.set_defaults(fn=cmd_serve, shadow=False)


def cmd_serve(a) -> int:
    from ..serve.run import listen, open_state, serve

    sock = listen(a.host, a.port)  # before the models load: a taken port fails at once
    return serve(open_state(a, settings), sock, a.shutdown_timeout)
