"""What a request may ask, and the one way it becomes decode settings.

The request bodies follow OpenAI's completions and chat completions (the fields vLLM serves), read
by pydantic. The ``vskip`` object of a body chooses the decoding method for that request: its keys
are the command line's decoding flags (``policy``, ``gamma``, ``alpha``, ``eta_b``, ...), each
checked for its type, laid over the server's own flags and turned into
:class:`~vskip.engine.settings.Settings` by the function the command line builds its own with
(``vskip serve`` hands it over), so a request is validated exactly as the command line is. A key that is not a decoding flag, or one that would
change the loaded models, is refused.
"""

from __future__ import annotations

import argparse
import copy
import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..defaults import MAX_SEED, POLICIES, POLICY_PARAMETERS, PRESETS


class ApiError(Exception):
    """A request the server refuses: an HTTP ``status``, the error ``type`` and the ``param`` at fault."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param)


def _unicode(value):
    """``value`` (a string, or strings in lists and text parts) if every string in it is valid
    Unicode; a lone surrogate (which JSON's ``\\udfff`` escapes can carry) is refused before any
    tokenizer sees it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"holds invalid Unicode ({e.reason} at character {e.start})") from None
    elif isinstance(value, list):
        for v in value:
            _unicode(v)
    elif isinstance(value, dict):
        for v in value.values():
            _unicode(v)
    return value


def _no_bool(value):
    """A number field refuses true and false (JSON's booleans are no numbers, though Python's are)."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


#: every field of both routes typed as OpenAI types it: a string is no number, a boolean neither,
#: and NaN or infinity no number at all
_STRICT = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _Common(BaseModel):
    """The sampling and output fields both endpoints take. Fields OpenAI defines that this server
    does not implement are refused when they ask for anything but their default; other unknown
    fields are ignored, as OpenAI's clients send some of their own."""

    model_config = _STRICT

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=1e6)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    logprobs: Literal[False, None] = None
    presence_penalty: Literal[0, 0.0] = 0.0
    frequency_penalty: Literal[0, 0.0] = 0.0
    vskip: dict[str, Any] | None = None

    _numbers = field_validator("max_tokens", "temperature", "top_p", "seed", "n", "presence_penalty",
                               "frequency_penalty", mode="before")(_no_bool)
    _text = field_validator("stop", "model", mode="before")(_unicode)

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops):
            raise bad("a stop string is empty", "stop")
        return tuple(stops)


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int]
    echo: Literal[False] = False
    best_of: Literal[1, None] = None
    suffix: Literal[None] = None

    _prompt = field_validator("prompt", mode="before")(_unicode)
    _best_of = field_validator("best_of", mode="before")(_no_bool)


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]]

    _content = field_validator("content", mode="before")(_unicode)

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad("this server reads text message parts only", "messages")
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    _completion_tokens = field_validator("max_completion_tokens", mode="before")(_no_bool)


#: the keys of a request's ``vskip`` object: the decoding flags a request may set, by type
_BLOCK_KEYS = {"gamma": int, "gamma_max": int, "min_match": int, "trim": float, "shadow": bool,
               "speculative_sampling": bool, "drafts": str}
VSKIP_KEYS = {"policy": str, "preset": str, **_BLOCK_KEYS,
              **{k: p.type for k, p in POLICY_PARAMETERS.items() if p.flag}}


#: the JSON values a flag of each type takes, and what to call them (true is not 1: bool is no int)
_JSON_TYPES = {int: ((int,), "an integer"), float: ((int, float), "a number"), bool: ((bool,), "true or false"),
               str: ((str,), "a string")}


def _typed(key: str, value, kind):
    """``value`` of the ``vskip`` object's ``key`` if it has the flag's type."""
    types, name = _JSON_TYPES[kind]
    if value is not None and (not isinstance(value, types) or (kind is not bool and isinstance(value, bool))):
        raise bad(f"vskip.{key} must be {name}, got {value!r}", f"vskip.{key}")
    return float(value) if kind is float and value is not None else value


def request_settings(base: argparse.Namespace, req: _Common, max_new_tokens: int, max_gamma: int, settings,
                     loaded=None):
    """The :class:`~vskip.engine.settings.Settings` of request ``req``: the server's flags ``base``,
    its ``vskip`` object's keys over them, the request's sampling fields and ``max_new_tokens``,
    made by ``settings`` (the command line's: parsed flags to checked settings). ``max_gamma``:
    the longest block the server allows; ``loaded``: the models' settings the server loaded with
    (made from ``base`` where not given)."""
    a = copy.copy(base)
    for key, value in (req.vskip or {}).items():
        if key not in VSKIP_KEYS:
            raise bad(f"unknown vskip key {key!r}; known: {', '.join(sorted(VSKIP_KEYS))}", f"vskip.{key}")
        value = _typed(key, value, VSKIP_KEYS[key])
        if key == "policy" and value not in POLICIES:
            raise bad(f"unknown policy {value!r}; known: {', '.join(POLICIES)}", "vskip.policy")
        if key == "preset" and value not in PRESETS:
            raise bad(f"unknown preset {value!r}; known: {', '.join(PRESETS)}", "vskip.preset")
        setattr(a, key, value)
    for key in ("gamma", "gamma_max"):
        g = getattr(a, key, None)
        if g is not None and g > max_gamma:
            raise bad(f"vskip.{key} {g} is more than this server allows ({max_gamma})", f"vskip.{key}")
    a.max_new_tokens = max_new_tokens
    a.temperature, a.top_p, a.sample_top_k = req.temperature, req.top_p, 0
    if req.seed is not None:
        a.seed = req.seed
    else:  # unseeded sampling draws its own seed; greedy draws nothing
        a.seed = secrets.randbelow(MAX_SEED + 1) if a.temperature > 0 else 0
    if a.temperature == 0:
        a.top_p = 1.0  # greedy: OpenAI clients may send a top_p that sampling alone reads
        if a.speculative_sampling:
            raise bad("vskip.speculative_sampling needs a temperature above 0", "vskip.speculative_sampling")
    try:
        s = settings(a)
        own = loaded if loaded is not None else settings(copy.copy(base)).models
    except ValueError as e:
        raise bad(str(e), "vskip") from None
    if (s.models.drafter, s.models.steps) != (own.drafter, own.steps):  # a preset's drafter
        raise bad(f"the request's settings draft with {s.models.drafter or 'the embedded drafter'} in "
                  f"{s.models.steps} reveal step(s); this server loaded {own.drafter or 'the embedded drafter'} "
                  f"with {own.steps}: start a server with that preset", "vskip.preset")
    return s
