"""The HTTP face of the server: FastAPI routes over the decode worker (:mod:`vskip.serve.engine`),
sse-starlette for the streams, prometheus-client for ``/metrics``, uvicorn to serve.

Every refusal is OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``: 400 for a
malformed or invalid request (FastAPI's validation errors included), 404 for an unknown model or
route, 429 when the queue is full and 503 while the server drains, both at once; 504 when a
request runs past ``--request-timeout`` (in a stream: an error event, then ``[DONE]``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException

from ..engine.decode import Job
from ..engine.prompting import encode_messages
from ..engine.settings import check_models, check_prompt
from ..engine.door import settings_record
from ..study.prefix.calibrate import check_online_settings
from .engine import Engine, Request
from .metrics import Metrics
from .protocol import ApiError, ChatRequest, CompletionRequest, bad, request_settings

#: the largest request body read; a longer one is refused before it is parsed (uvicorn sets no bound)
MAX_BODY_BYTES = 4 << 20
#: seconds a request's body may take to arrive whole; a slower one is answered 408 (uvicorn sets no bound)
BODY_SECONDS = 30.0


@dataclass
class ServeState:
    """What the routes share: the worker, the server's flags (what a request's ``vskip`` object
    lays its keys over), the models' limits and the served model's name."""

    engine: Engine
    metrics: Metrics
    base: object
    tokenizer: object
    model_name: str
    max_new_tokens: int
    max_gamma: int
    #: parsed flags to checked :class:`~vskip.engine.settings.Settings` (the command line's function)
    make_settings: object
    #: the models' settings the server loaded with (:class:`~vskip.engine.models.config.ModelConfig`)
    models: object = None

    @property
    def loop(self):
        return self.engine.loop

    @property
    def verifier(self):
        return self.engine.loop.models.verifier


class BodyLimit:
    """Refuses a request body over ``limit`` bytes with a 400 before the route reads it (declared in
    Content-Length, or counted as it arrives), and one that takes more than ``seconds`` to arrive with
    a 408; otherwise hands the body on unchanged."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES, seconds: float | None = None):
        self.app, self.limit, self.seconds = app, limit, BODY_SECONDS if seconds is None else seconds

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._refuse(scope, receive, send)
        held, size = [], 0
        if scope.get("method") in ("POST", "PUT", "PATCH"):
            deadline = time.monotonic() + self.seconds
            while True:
                try:
                    msg = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    err = ApiError(408, f"the request body did not arrive whole within {self.seconds:g} s",
                                   "invalid_request_error")
                    return await JSONResponse(err.body(), status_code=408)(scope, receive, send)
                held.append(msg)
                if msg["type"] != "http.request":
                    break
                size += len(msg.get("body", b""))
                if size > self.limit:
                    return await self._refuse(scope, receive, send)
                if not msg.get("more_body"):
                    break

        async def replay():
            return held.pop(0) if held else await receive()

        return await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send):
        err = bad(f"the request body is over {self.limit} bytes")
        await JSONResponse(err.body(), status_code=400)(scope, receive, send)



#: the names pydantic gives the branches of a union in an error's location, which name no field
_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "dict", "list", "none", "function-before", "function-after"})

def _error(err: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if err.status in (429, 503) else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def build_app(state: ServeState) -> FastAPI:
    """The routes over ``state``; the worker starts and stops with the app's lifespan."""

    @asynccontextmanager
    async def lifespan(app):
        state.engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.engine.stop)

    app = FastAPI(title="vskip", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit)

    @app.exception_handler(ApiError)
    async def api_error(request, err: ApiError):
        return _error(err)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, err: RequestValidationError):
        first = (err.errors() or [{}])[0]
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        if first.get("type") == "json_invalid":
            return _error(bad(f"the body is not valid JSON: {first.get('msg', '')}"))
        # the field's path: list indices and the branches of a union type (``str``, ``list[str]``) left out
        param = ".".join(x for x in loc if not x.isdigit() and x not in _TYPE_LABELS and "[" not in x) or None
        return _error(bad(f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid')}", param))

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return _error(ApiError(err.status_code, str(err.detail), kind))

    @app.exception_handler(Exception)
    async def internal(request, err: Exception):
        return _error(ApiError(500, f"{type(err).__name__}: {err}", "internal_error"))

    @app.get("/health")
    async def health():
        if state.engine.draining:
            return _error(ApiError(503, "the server is shutting down", "service_unavailable_error"))
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0,
                                            "owned_by": "vskip", "max_model_len": state.verifier.max_length}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: HttpRequest):
        _check_model(state, body.model)
        return await _respond(state, body, _completion_ids(state, body.prompt), body.max_tokens, chat=False,
                              request=request)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: HttpRequest):
        _check_model(state, body.model)
        try:
            ids = encode_messages(state.tokenizer, [{"role": m.role, "content": m.text()} for m in body.messages])
        except (ValueError, TypeError) as e:
            raise bad(str(e), "messages") from None
        return await _respond(state, body, ids, body.max_completion_tokens or body.max_tokens, chat=True,
                              request=request)

    return app


def _check_model(state: ServeState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {state.model_name!r}",
                       "not_found_error", "model")


def _completion_ids(state: ServeState, prompt) -> list[int]:
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        vocab = len(state.tokenizer)
        if any(not 0 <= x < vocab for x in prompt):
            raise bad(f"a prompt token id lies outside the vocabulary of {vocab}", "prompt")
        return list(prompt)
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise bad("this server takes one prompt per request", "prompt")
        prompt = prompt[0]
    if not prompt:
        raise bad("the prompt is empty", "prompt")
    return list(state.tokenizer(prompt)["input_ids"])


def _job(state: ServeState, body, ids: list[int], max_tokens: int | None) -> Job:
    """The request's job, its settings checked against the models, its prompt against the context."""
    if not ids:
        raise bad("the prompt is empty", "prompt")
    room = state.verifier.max_length - len(ids)
    want = max_tokens if max_tokens is not None else max(1, min(state.max_new_tokens, room - state.max_gamma - 1))
    s = request_settings(state.base, body, want, state.max_gamma, state.make_settings, state.models)
    try:
        check_prompt(ids, state.verifier, s.decode)
    except ValueError as e:
        raise bad(str(e), "max_tokens") from None
    loop = state.loop
    try:
        check_models(loop.models.drafter, s.policy, s.decode, loop.models.predictor)
    except ValueError as e:
        raise bad(str(e), "vskip") from None
    p = loop.models.predictor
    if s.policy.learned and getattr(p, "kind", None) != s.policy.predictor_kind:
        raise bad(f"policy {s.policy.name!r} reads a {s.policy.predictor_kind} predictor; this server loaded "
                  f"{'none' if p is None else 'a ' + str(p.kind) + ' one'}", "vskip.policy")
    if s.policy.learned and getattr(p, "online", None) is None:
        raise bad("a server's prompts belong to no fold of a predictor trained by rotation: give the server an "
                  "online-calibrated prefix model (vskip calibrate-online)", "vskip.policy")
    if s.policy.alpha is not None:  # the online thresholds hold for the settings they were chosen with
        try:
            check_online_settings(p, settings_record(s))
        except ValueError as e:
            raise bad(str(e), "vskip") from None
    return Job(ids, policy=s.policy, cfg=s.decode)


async def _respond(state: ServeState, body, ids, max_tokens, chat: bool, request: HttpRequest):
    job = _job(state, body, ids, max_tokens)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    req = Request(rid, job, body.stops(), state.engine.request_timeout, asyncio.get_running_loop())
    state.engine.submit(req)
    created = int(time.time())
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return EventSourceResponse(_stream(state, req, chat, created, usage), sep="\n")
    return await _collect(state, req, chat, created, request)


def _head(req: Request, chat: bool, created: int, state: ServeState, chunk: bool) -> dict:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": req.id, "object": kind, "created": created, "model": state.model_name}


def _choice(chat: bool, text: str | None, reason: str | None, chunk: bool) -> dict:
    if not chat:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
    if chunk:
        return {"index": 0, "delta": {} if text is None else {"content": text}, "logprobs": None, "finish_reason": reason}
    return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": reason}


async def _next(req: Request, request: HttpRequest | None):
    """The request's next event; None when its client went away (checked twice a second)."""
    getter = asyncio.ensure_future(req.events.get())
    try:
        while True:
            done, _ = await asyncio.wait({getter}, timeout=0.5)
            if done:
                return getter.result()
            if request is not None and await request.is_disconnected():
                return None
    finally:
        if not getter.done():
            getter.cancel()


async def _collect(state: ServeState, req: Request, chat: bool, created: int, request: HttpRequest):
    parts = []
    while True:
        event = await _next(req, request)
        if event is None:  # the client is gone: free its slot
            state.engine.cancel(req)
            return Response(status_code=499)
        kind, data = event
        if kind == "text":
            parts.append(data)
        elif kind == "error":
            return _error(data)
        else:
            return {**_head(req, chat, created, state, False),
                    "choices": [_choice(chat, "".join(parts), data["finish_reason"], False)],
                    "usage": data["usage"], "vskip": data["vskip"]}


async def _stream(state: ServeState, req: Request, chat: bool, created: int, include_usage: bool):
    """The SSE events of a streamed request: ``data: {chunk}`` lines, then ``data: [DONE]``. A client
    that goes away cancels the generator, which cancels the request and frees its slot."""
    head = _head(req, chat, created, state, True)
    try:
        if chat:
            yield {"data": json.dumps({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                            "logprobs": None, "finish_reason": None}]})}
        while True:
            kind, data = await req.events.get()
            if kind == "text":
                yield {"data": json.dumps({**head, "choices": [_choice(chat, data, None, True)]})}
            elif kind == "error":
                yield {"data": json.dumps(data.body())}
                break
            else:
                yield {"data": json.dumps({**head, "choices": [_choice(chat, None if chat else "", data["finish_reason"], True)],
                                           "vskip": data["vskip"]})}
                if include_usage:
                    yield {"data": json.dumps({**head, "choices": [], "usage": data["usage"]})}
                break
        yield {"data": "[DONE]"}
    finally:
        if not req.finished:
            state.engine.cancel(req)
