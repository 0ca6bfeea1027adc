"""``vskip serve``: the OpenAI-compatible server over the batched loop, on 127.0.0.1 and a free port,
started and stopped by each test. The fake pair (float64, stateless) makes every expected text
exact: greedy Strict SDD and ``ar`` give the verifier's own greedy continuation, and any policy
in a shared batch gives what a decode of its own gives."""

from __future__ import annotations

import json
import re
import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from fakes import EOS, FakeDrafter, FakeTokenizer, FakeVerifier, StubPredictor
from openai import APIStatusError, OpenAI

from vskip.commands import build_parser
from vskip.commands.flags import settings
from vskip.engine.decode import decode
from vskip.serve.protocol import CompletionRequest, request_settings
from vskip.serve.run import listen, make_server, open_state
from vskip.engine.door import Decoder

TOK = FakeTokenizer()
PROMPTS = ["abc", "hello", "qrstuv", "xyzzy", "mnop", "Gdef"]


class SlowVerifier(FakeVerifier):
    """The fake verifier, each forward taking ``delay`` seconds (so that requests overlap)."""

    def __init__(self, delay: float):
        super().__init__()
        self.delay = delay

    def score_many(self, calls):
        time.sleep(self.delay)
        return super().score_many(calls)


@contextmanager
def running(*flags, verifier=None, drafter=None, predictor=None):
    a = build_parser().parse_args(["serve", "--port", "0", *flags])
    pair = SimpleNamespace(drafter=drafter or FakeDrafter(0.3), verifier=verifier or FakeVerifier(),
                           tokenizer=TOK, runtime=None)
    state = open_state(a, settings, Decoder(settings(a), pair, None, predictor))
    sock = listen("127.0.0.1", 0)
    server = make_server(state, a.shutdown_timeout)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield SimpleNamespace(url=url, state=state, server=server, thread=thread,
                              client=OpenAI(base_url=url + "/v1", api_key="none", max_retries=0))
    finally:
        server.should_exit = True
        thread.join(20)
        assert not thread.is_alive()


def greedy_text(prompt: str, n: int) -> tuple[str, int]:
    """The verifier's own greedy continuation of ``prompt`` (what lossless decoding gives) and its
    token count."""
    out = FakeVerifier().greedy(TOK(prompt)["input_ids"], n)
    return TOK.decode(out, skip_special_tokens=True), len(out)


def decoded_alone(prompt: str, n: int, vskip: dict, **fields) -> str:
    """What one decode of its own gives for a request's settings (``fields``: its sampling fields)."""
    a = build_parser().parse_args(["serve"])
    settings(a)
    s = request_settings(a, CompletionRequest(prompt=prompt, vskip=vskip, **fields), n, 64, settings)
    res = decode(TOK(prompt)["input_ids"], FakeDrafter(0.3), FakeVerifier(), s.policy, s.decode)
    return TOK.decode(res.tokens, skip_special_tokens=True)


def post(srv, path: str, body, **kw) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(srv.url + path, content=data, headers={"content-type": "application/json"}, timeout=30, **kw)


def metric(srv, name: str, **labels) -> float:
    text = httpx.get(srv.url + "/metrics").text
    want = {"model_name": srv.state.model_name, **labels}
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([\w:]+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name:
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in want.items()):
                total += float(m.group(3))
    return total


# -- the official client, streamed and not ------------------------------------------------------------
def test_the_openai_client_streamed_and_not_gives_the_lossless_text():
    with running("--policy", "strict") as srv:
        want, n = greedy_text("abc", 30)
        full = srv.client.completions.create(model=srv.state.model_name, prompt="abc", max_tokens=30)
        assert full.choices[0].text == want
        assert full.usage.prompt_tokens == 3 and full.usage.completion_tokens == n
        assert full.usage.total_tokens == 3 + n
        assert full.vskip["policy"] == "strict" and full.vskip["skipped_rounds"] == 0
        assert full.vskip["unverified_share"] == 0.0 and full.vskip["verifier_calls"] >= 1

        chunks = list(srv.client.completions.create(model=srv.state.model_name, prompt="abc", max_tokens=30,
                                                    stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == n
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason

        chat = srv.client.chat.completions.create(model=srv.state.model_name, max_tokens=30,
                                                  messages=[{"role": "user", "content": "abc"}])
        assert chat.choices[0].message.content == want and chat.choices[0].message.role == "assistant"
        stream = srv.client.chat.completions.create(model=srv.state.model_name, max_tokens=30, stream=True,
                                                    messages=[{"role": "user", "content": "abc"}])
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want


def test_the_finish_reason_is_stop_at_eos_and_length_at_the_budget():
    with running("--policy", "strict") as srv:
        ids = FakeVerifier().greedy(TOK("abc")["input_ids"], 200)
        assert ids[-1] == EOS
        short = srv.client.completions.create(model=srv.state.model_name, prompt="abc", max_tokens=5)
        assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 5
        whole = srv.client.completions.create(model=srv.state.model_name, prompt="abc", max_tokens=200)
        assert whole.choices[0].finish_reason == "stop" and whole.usage.completion_tokens == len(ids)


def test_a_stop_string_ends_the_text_before_it_streamed_and_not():
    with running("--policy", "strict") as srv:
        want, _ = greedy_text("hello", 40)
        stop = want[6:8]
        cut = want.index(stop)
        full = srv.client.completions.create(model=srv.state.model_name, prompt="hello", max_tokens=40, stop=[stop])
        assert full.choices[0].text == want[:cut] and full.choices[0].finish_reason == "stop"
        chunks = srv.client.completions.create(model=srv.state.model_name, prompt="hello", max_tokens=40,
                                               stop=stop, stream=True)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want[:cut]


# -- the method per request, in one batch -----------------------------------------------------------
REQUESTS = [({"policy": "strict"}, "abc"), ({"policy": "ar"}, "hello"),
            ({"policy": "raw", "eta_b": 0.5, "eta_c": 0.5, "k_min": 1}, "qrstuv"),
            ({"policy": "periodic", "period": 2, "period_k": 3, "gamma": 5}, "xyzzy"),
            ({"policy": "lenience", "lenience": 0.5}, "mnop"), ({"policy": "strict", "gamma": 16}, "Gdef")]


def test_requests_with_their_own_methods_share_the_batch_and_each_gets_its_own_decode():
    """Six requests at once through two slots, each with its own policy and block length: each
    text equals what a decode of its own settings gives, and the skips show in its vskip block."""
    with running("--max-batch", "2", verifier=SlowVerifier(0.002)) as srv:
        out = {}

        def ask(i):
            vs, prompt = REQUESTS[i]
            out[i] = srv.client.completions.create(model=srv.state.model_name, prompt=prompt, max_tokens=40,
                                                   extra_body={"vskip": vs})

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(REQUESTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for i, (vs, prompt) in enumerate(REQUESTS):
            assert out[i].choices[0].text == decoded_alone(prompt, 40, vs), vs
            assert out[i].vskip["policy"] == vs["policy"]
        assert out[1].vskip["draft_blocks"] == 0  # ar drafts nothing
        assert out[3].vskip["skipped_rounds"] > 0 and out[3].vskip["unverified_share"] > 0
        assert metric(srv, "vskip:batch_size_sum") > metric(srv, "vskip:batch_size_count")  # rounds held two
        assert metric(srv, "vskip:skipped_rounds_total") > 0
        assert metric(srv, "vskip:spec_decode_num_drafts_total") > 0
        accepted = metric(srv, "vskip:spec_decode_num_accepted_tokens_total")
        assert accepted == metric(srv, "vskip:spec_decode_num_accepted_tokens_per_pos_total")
        assert 0 < accepted <= metric(srv, "vskip:spec_decode_num_draft_tokens_total")
        assert metric(srv, "vskip:request_success_total") == len(REQUESTS)
        assert metric(srv, "vskip:num_requests_running") == 0 and metric(srv, "vskip:num_requests_waiting") == 0
        assert metric(srv, "vskip:time_to_first_token_seconds_count") == len(REQUESTS)


def test_a_sampled_request_with_a_seed_draws_the_same_text_twice():
    with running("--policy", "strict") as srv:
        kw = dict(model=srv.state.model_name, prompt="abc", max_tokens=30, temperature=0.8, seed=7)
        a = srv.client.completions.create(**kw).choices[0].text
        b = srv.client.completions.create(**kw).choices[0].text
        c = srv.client.completions.create(**{**kw, "seed": 8}).choices[0].text
        assert a == b == decoded_alone("abc", 30, {"policy": "strict"}, temperature=0.8, seed=7)
        assert c != a


class OnlinePrefix(StubPredictor):
    """A prefix model calibrated online (a stub): one rotation, its thresholds by alpha, and the
    settings they hold for."""

    kind, path = "prefix", "P"

    def __init__(self, settings_held: dict):
        super().__init__(2.0)
        self.online = {"settings": settings_held, "thresholds": {"0.05": 0.5}}

    def threshold(self, task_id, alpha):
        assert task_id is None  # a server's prompt belongs to no data set
        return self.online["thresholds"][f"{alpha:g}"]


def test_the_prefix_scheduler_at_alpha_serves_only_the_settings_its_thresholds_hold_for():
    from vskip.engine.door import settings_record
    from vskip.study.prefix.calibrate import run_settings

    vs = {"policy": "prefix", "alpha": 0.05, "cost_ratio": 0.2}
    a = build_parser().parse_args(["serve", "--predictor", "P"])
    settings(a)
    held = run_settings(settings_record(request_settings(a, CompletionRequest(prompt="abc", vskip=vs), 30, 64, settings)))
    pred = OnlinePrefix(held)
    with running("--predictor", "P", predictor=pred) as srv:
        ok = post(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 30, "vskip": vs})
        assert ok.status_code == 200, ok.text
        assert ok.json()["vskip"]["policy"] == "prefix" and pred.calls > 0
        err = _error(post(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 31, "vskip": vs}), 400, "vskip")
        assert "max_new_tokens 31" in err["message"]
        _error(post(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 30, "vskip": {**vs, "gamma": 6}}), 400)
        _error(post(srv, "/v1/completions", {"prompt": "abc", "vskip": {"policy": "marginal"}}), 400, "vskip.policy")


# -- errors ---------------------------------------------------------------------------------------------
def _error(r: httpx.Response, status: int, param=None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status and err["message"]
    if param is not None:
        assert err["param"] == param
    return err


def test_every_malformed_or_invalid_request_is_a_400_with_an_error_body():
    with running() as srv:
        _error(post(srv, "/v1/completions", b'{"prompt": "abc",'), 400)
        _error(post(srv, "/v1/completions", {"prompt": "abc", "temperature": -1}), 400, "temperature")
        _error(post(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 20_000}), 400, "max_tokens")
        _error(post(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 0}), 400, "max_tokens")
        _error(post(srv, "/v1/completions", {"prompt": "a" * (10 << 20)}), 400)
        _error(post(srv, "/v1/completions", {"prompt": "abc", "vskip": {"gamma": 8, "bogus": 1}}), 400, "vskip.bogus")
        _error(post(srv, "/v1/completions", {"prompt": "abc", "vskip": {"gamma": "8"}}), 400, "vskip.gamma")
        _error(post(srv, "/v1/completions", {"prompt": "abc", "vskip": {"shadow": 1}}), 400, "vskip.shadow")
        _error(post(srv, "/v1/completions", {"prompt": "abc", "vskip": {"policy": "nope"}}), 400, "vskip.policy")
        _error(post(srv, "/v1/completions", {"prompt": "abc", "vskip": {"gamma": 65}}), 400, "vskip.gamma")
        _error(post(srv, "/v1/completions", {"prompt": "abc", "vskip": {"policy": "marginal"}}), 400)
        _error(post(srv, "/v1/completions", {"prompt": "abc", "vskip": {"policy": "lenience"}, "temperature": 1}), 400)
        _error(post(srv, "/v1/completions", {"prompt": "abc", "n": 2}), 400, "n")
        _error(post(srv, "/v1/completions", {"prompt": ["abc", "def"]}), 400, "prompt")
        _error(post(srv, "/v1/completions", {"prompt": [3, 99]}), 400, "prompt")
        _error(post(srv, "/v1/completions", {"prompt": ""}), 400, "prompt")
        _error(post(srv, "/v1/completions", {"prompt": "abc", "stop": [""]}), 400, "stop")
        _error(post(srv, "/v1/chat/completions", {"messages": []}), 400, "messages")
        _error(post(srv, "/v1/completions", {"model": "gpt-4", "prompt": "abc"}), 404, "model")
        _error(httpx.get(srv.url + "/v2/nothing"), 404)
        with pytest.raises(APIStatusError) as e:
            srv.client.completions.create(model="gpt-4", prompt="abc")
        assert e.value.status_code == 404
        ok = post(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 3})  # the server still serves
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        assert httpx.get(srv.url + "/v1/models").json()["data"][0]["id"] == srv.state.model_name
        assert httpx.get(srv.url + "/health").json() == {"status": "ok"}


def test_every_field_is_typed_as_openai_types_it_and_every_text_is_valid_unicode():
    """The class, not the examples: a string is no number, a boolean is neither, NaN and infinity are
    no numbers, and a lone surrogate in any text field is a 400 naming the field, never a 500."""
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    with running() as srv:
        for field, value in (("max_tokens", "8"), ("max_tokens", True), ("max_tokens", 8.5), ("temperature", "0.5"),
                             ("temperature", True), ("top_p", False), ("seed", "3"), ("stream", "yes"),
                             ("stream", 1), ("n", True), ("stop", 3), ("presence_penalty", False)):
            for path, body in (("/v1/completions", {"prompt": "abc"}), ("/v1/chat/completions", chat)):
                _error(post(srv, path, body | {field: value}), 400, field)
        _error(post(srv, "/v1/chat/completions", chat | {"max_completion_tokens": "4"}), 400, "max_completion_tokens")
        for bad_number in ("NaN", "Infinity", "-Infinity"):  # Python's JSON reads these; they are no numbers
            raw = '{"prompt": "abc", "temperature": %s}' % bad_number
            _error(post(srv, "/v1/completions", raw), 400, "temperature")
        surrogate = '"a\\udfffb"'
        _error(post(srv, "/v1/completions", '{"prompt": %s, "max_tokens": 4}' % surrogate), 400, "prompt")
        _error(post(srv, "/v1/completions", '{"prompt": [%s], "max_tokens": 4}' % surrogate), 400, "prompt")
        _error(post(srv, "/v1/completions", '{"prompt": "abc", "stop": [%s]}' % surrogate), 400, "stop")
        _error(post(srv, "/v1/chat/completions", '{"messages": [{"role": "user", "content": %s}]}' % surrogate), 400,
               "messages.content")
        parts = '[{"type": "text", "text": %s}]' % surrogate
        _error(post(srv, "/v1/chat/completions", '{"messages": [{"role": "user", "content": %s}]}' % parts), 400,
               "messages.content")
        ok = post(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 3, "temperature": 0})  # an integer number
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_a_full_queue_answers_429_at_once_and_the_admitted_requests_finish():
    with running("--max-batch", "1", "--max-queue", "1", "--policy", "ar", verifier=SlowVerifier(0.1)) as srv:
        out = {}

        def ask(key, prompt):
            out[key] = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 20})

        first = threading.Thread(target=ask, args=("first", "abc"))
        first.start()
        _wait(lambda: srv.state.engine.running)
        second = threading.Thread(target=ask, args=("second", "hello"))
        second.start()
        _wait(lambda: srv.state.engine.waiting)
        t = time.monotonic()
        err = _error(post(srv, "/v1/completions", {"prompt": "xyz", "max_tokens": 20}), 429)
        assert time.monotonic() - t < 1.0 and err["type"] == "rate_limit_error"  # a request takes 2 s
        first.join(30)
        second.join(30)
        assert out["first"].json()["choices"][0]["text"] == greedy_text("abc", 20)[0]
        assert out["second"].json()["choices"][0]["text"] == greedy_text("hello", 20)[0]
        assert metric(srv, "vskip:request_rejected_total", reason="queue_full") == 1


def test_requests_arriving_within_one_round_take_the_free_slots_before_the_queue_counts():
    """Batch 3, queue 0, one request decoding: two more arriving in the same round are accepted
    (the free slots take them when the round ends), a third is refused at once."""
    import asyncio

    from vskip.engine.decode import Job
    from vskip.serve.engine import Request
    from vskip.serve.protocol import ApiError

    with running("--max-batch", "3", "--max-queue", "0", "--policy", "ar", verifier=SlowVerifier(0.3)) as srv:
        stream = srv.client.completions.create(model=srv.state.model_name, prompt="abc", max_tokens=200, stream=True)
        next(iter(stream))
        eng, aloop = srv.state.engine, asyncio.new_event_loop()
        try:
            reqs = [Request(id=str(i), job=Job(prompt=TOK(p)["input_ids"]), stops=(), timeout=None, aloop=aloop)
                    for i, p in enumerate(["hi", "mnop", "qrs"])]
            with eng.cv:  # within one round: the worker cannot admit between these
                eng.submit(reqs[0])
                eng.submit(reqs[1])
                with pytest.raises(ApiError) as refused:
                    eng.submit(reqs[2])
            assert refused.value.status == 429
            _wait(lambda: len(eng.running) == 3)
            for r in reqs[:2]:
                eng.cancel(r)
            stream.close()
        finally:
            aloop.close()


def test_a_request_past_its_timeout_ends_with_an_error_and_frees_its_slot():
    with running("--max-batch", "1", "--request-timeout", "0.5", "--policy", "ar",
                 verifier=SlowVerifier(0.05)) as srv:
        _error(post(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 100}), 504)
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=30,
                          json={"prompt": "abc", "max_tokens": 100, "stream": True}) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 504
        ok = post(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == greedy_text("abc", 3)[0]
        assert not srv.state.engine.running and not srv.state.loop.active


def test_a_cancelled_stream_frees_its_slot_for_the_next_request():
    with running("--max-batch", "1", "--policy", "ar", verifier=SlowVerifier(0.2)) as srv:
        whole = len(FakeVerifier().greedy(TOK("abc")["input_ids"], 200))  # 7 s of decoding
        stream = srv.client.completions.create(model=srv.state.model_name, prompt="abc", max_tokens=200, stream=True)
        next(iter(stream))
        stream.close()
        t = time.monotonic()
        ok = srv.client.completions.create(model=srv.state.model_name, prompt="hello", max_tokens=3)
        assert ok.choices[0].text == greedy_text("hello", 3)[0]
        assert time.monotonic() - t < 4.0
        assert metric(srv, "vskip:request_success_total", finished_reason="cancelled") == 1
        assert metric(srv, "vskip:generation_tokens_total") < whole // 2


def test_a_request_cancelled_while_it_waits_is_counted_as_cancelled():
    import asyncio

    from vskip.engine.decode import Job
    from vskip.serve.engine import Request

    with running("--max-batch", "1", "--policy", "ar", verifier=SlowVerifier(0.2)) as srv:
        stream = srv.client.completions.create(model=srv.state.model_name, prompt="abc", max_tokens=200, stream=True)
        next(iter(stream))  # the one slot is taken
        eng, aloop = srv.state.engine, asyncio.new_event_loop()
        try:
            req = Request(id="queued", job=Job(prompt=TOK("hi")["input_ids"]), stops=(), timeout=None, aloop=aloop)
            eng.submit(req)
            assert req in eng.waiting
            eng.cancel(req)
            _wait(lambda: req not in eng.waiting)
            assert metric(srv, "vskip:request_success_total", finished_reason="cancelled") == 1
            stream.close()
            _wait(lambda: metric(srv, "vskip:request_success_total", finished_reason="cancelled") == 2)
        finally:
            aloop.close()


def test_metrics_time_the_queue_the_prefill_and_each_gap_between_tokens():
    """One streamed request: one queue time, one prefill time (admission to first token), one
    decode time, and an inter-token latency per delivery after the first."""
    with running("--policy", "ar", verifier=SlowVerifier(0.01)) as srv:
        chunks = [c for c in srv.client.completions.create(model=srv.state.model_name, prompt="abc", max_tokens=12,
                                                            stream=True) if c.choices[0].text]
        _wait(lambda: metric(srv, "vskip:request_success_total") == 1)
        for name in ("request_queue_time", "request_prefill_time", "time_to_first_token", "request_decode_time"):
            assert metric(srv, f"vskip:{name}_seconds_count") == 1, name
        # ar delivers one token a round: 12 deliveries, 11 gaps (a chunk may hold two when text waits on a character)
        assert metric(srv, "vskip:inter_token_latency_seconds_count") == 11
        assert metric(srv, "vskip:inter_token_latency_seconds_sum") >= 11 * 0.01 * 0.9
        assert len(chunks) >= 2


def test_the_server_reads_prompts_in_chunks_of_its_flag_and_a_long_one_delays_no_stream():
    """``--prefill-chunk`` reaches the loop (0: off). A prompt of 60 tokens is read 4 tokens a round
    beside a running request, and both texts are lossless."""
    with running("--policy", "ar", "--prefill-chunk", "0") as srv:
        assert srv.state.loop.prefill_chunk is None
        assert srv.state.loop.draft_max_batch == 1  # the default: Strict SDD drafts in rounds of one sequence
    with running("--policy", "ar", "--draft-max-batch", "-1") as srv:
        assert srv.state.loop.draft_max_batch is None and srv.state.loop.prefill_chunk == 256
        assert srv.state.loop.prefill_depth is None
    with running("--policy", "ar", "--prefill-depth", "1024") as srv:
        assert srv.state.loop.prefill_depth == 1024
    verifier = SlowVerifier(0.01)
    with running("--policy", "ar", "--max-batch", "2", "--prefill-chunk", "4", "--prefill-depth", "0",
                 verifier=verifier) as srv:
        assert srv.state.loop.prefill_chunk == 4
        long_prompt = "abcdefghij" * 6
        got = {}

        def ask(prompt, n):
            got[prompt] = srv.client.completions.create(model=srv.state.model_name, prompt=prompt, max_tokens=n)

        short = threading.Thread(target=ask, args=("xyzzy", 60))
        short.start()
        _wait(lambda: srv.state.loop.active)
        ask(long_prompt, 5)
        short.join(30)
        reads = [n for slot, n in verifier.prefilled if slot == 1]  # the short one holds slot 0
        assert reads == list(range(4, len(long_prompt), 4)) + [len(long_prompt) - 1]  # 4 a round, to the last but one
        for prompt, n in (("xyzzy", 60), (long_prompt, 5)):
            assert got[prompt].choices[0].text == greedy_text(prompt, n)[0]


def test_streams_still_running_at_the_shutdown_deadline_end_with_an_error_event_and_done():
    """SIGTERM with ``--shutdown-timeout 0.3``: a stream that cannot finish in time gets a 503 as its
    last event, then ``[DONE]``; the server exits."""
    import signal

    with running("--policy", "ar", "--shutdown-timeout", "0.3", verifier=SlowVerifier(0.05)) as srv:
        lines, done = [], threading.Event()

        def read():
            with httpx.stream("POST", srv.url + "/v1/completions", timeout=30,
                              json={"prompt": "abc", "max_tokens": 500, "stream": True}) as r:
                lines.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))
            done.set()

        reader = threading.Thread(target=read)
        reader.start()
        _wait(lambda: srv.state.loop.active)
        t = time.monotonic()
        srv.server.handle_exit(signal.SIGTERM, None)
        assert done.wait(20)
        assert lines[-1] == "[DONE]"
        assert json.loads(lines[-2])["error"]["code"] == 503
        assert time.monotonic() - t < 5
        srv.thread.join(20)
        assert not srv.thread.is_alive()


def test_a_body_that_stops_arriving_is_answered_408(monkeypatch):
    import socket

    import vskip.serve.app as app_module

    monkeypatch.setattr(app_module, "BODY_SECONDS", 0.5)
    with running("--policy", "ar") as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"prompt\": ")
            t, reply = time.monotonic(), b""
            while not reply.endswith(b"}"):  # the headers and the body may come apart
                part = s.recv(4096)
                if not part:
                    break
                reply += part
            reply = reply.decode()
        assert reply.startswith("HTTP/1.1 408") and time.monotonic() - t < 5
        assert json.loads(reply.split("\r\n\r\n", 1)[1])["error"]["code"] == 408


def test_an_error_inside_one_sequence_fails_that_request_alone(monkeypatch):
    import vskip.engine.decode as loop_module

    plan = loop_module._Decode.plan
    poison = TOK("Q")["input_ids"][0]

    def failing_plan(self, *args):
        if self.job.prompt[0] == poison and self.generated >= 4:
            raise RuntimeError("this sequence breaks")
        return plan(self, *args)

    monkeypatch.setattr(loop_module._Decode, "plan", failing_plan)
    with running("--max-batch", "4", "--policy", "strict", verifier=SlowVerifier(0.005)) as srv:
        out = {}

        def ask(prompt):
            out[prompt] = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 30})

        threads = [threading.Thread(target=ask, args=(p,)) for p in ("abc", "Qrs", "hello")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        err = _error(out["Qrs"], 500)
        assert "this sequence breaks" in err["message"]
        for p in ("abc", "hello"):
            assert out[p].json()["choices"][0]["text"] == greedy_text(p, 30)[0]


class FailingOnce(FakeVerifier):
    """The fake verifier, its third forward failing (a forward the whole batch shares)."""

    def score_many(self, calls):
        self.forwards = getattr(self, "forwards", 0) + 1
        if self.forwards == 3:
            raise RuntimeError("the device fell over")
        return super().score_many(calls)


def test_a_failed_shared_forward_fails_its_round_and_the_server_goes_on():
    with running("--policy", "strict", verifier=FailingOnce()) as srv:
        err = _error(post(srv, "/v1/completions", {"prompt": "abc", "max_tokens": 30}), 500)
        assert "the device fell over" in err["message"]
        ok = post(srv, "/v1/completions", {"prompt": "hello", "max_tokens": 30})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == greedy_text("hello", 30)[0]
        assert not srv.state.loop.active


def test_sigterm_refuses_new_requests_and_lets_the_running_ones_finish():
    """uvicorn's exit handler (what SIGTERM calls): the running stream still ends with its whole
    text and [DONE]; a request after it is refused (503 or the connection closed)."""
    import signal

    with running("--max-batch", "2", "--policy", "ar", verifier=SlowVerifier(0.03)) as srv:
        want, _ = greedy_text("abc", 40)
        got, done = [], threading.Event()

        def read():
            with httpx.stream("POST", srv.url + "/v1/completions", timeout=30,
                              json={"prompt": "abc", "max_tokens": 40, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        got.append(line[6:])
            done.set()

        reader = threading.Thread(target=read)
        reader.start()
        _wait(lambda: got)
        srv.server.handle_exit(signal.SIGTERM, None)
        assert srv.state.engine.draining
        try:
            late = post(srv, "/v1/completions", {"prompt": "hello", "max_tokens": 3})
            assert late.status_code == 503
        except httpx.TransportError:
            pass  # the listening socket is already closed
        assert done.wait(30)
        assert got[-1] == "[DONE]"
        assert "".join(json.loads(e)["choices"][0]["text"] for e in got[:-1]) == want
        srv.thread.join(20)
        assert not srv.thread.is_alive()


def _wait(cond, timeout: float = 20.0):
    t = time.monotonic()
    while not cond():
        assert time.monotonic() - t < timeout
        time.sleep(0.005)


# -- the embedded pair, a real process ------------------------------------------------------------------
@pytest.mark.model
def test_vskip_serve_on_the_embedded_pair_matches_vskip_generate_and_stops_cleanly_on_sigterm(tmp_path):
    """``vskip serve`` as a user starts it: at temperature 0 with Strict SDD, the streamed text, the
    non-streamed text and ``vskip generate``'s output are equal; usage counts the tokens; SIGTERM
    during a stream lets it finish, then the process exits 0."""
    import os
    import signal
    import subprocess
    import sys

    threads = os.environ.get("VSKIP_TEST_THREADS", "1")
    prompt, n = "Write a Python function that returns the square of a number.", 24
    common = ["--policy", "strict", "--threads", threads, "--device", "cpu"]
    gen = subprocess.run([sys.executable, "-m", "vskip", "generate", prompt, "--max-new-tokens", str(n), *common],
                         capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr
    want = gen.stdout[:-1]  # print's newline
    assert f"tokens={n} " in gen.stderr or "stop=eos" in gen.stderr

    err = open(tmp_path / "serve.err", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "vskip", "serve", "--port", "0", "--max-batch", "2", *common],
                            stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        url = None
        for _ in range(600):
            m = re.search(r"on (http://[\d.]+:\d+) ", (tmp_path / "serve.err").read_text())
            if m:
                url = m.group(1)
                break
            assert proc.poll() is None, (tmp_path / "serve.err").read_text()
            time.sleep(0.1)
        assert url, "the server never said where it listens"
        from vskip.engine.models.native.build import chosen_isa

        assert f"verifier native {chosen_isa()})" in (tmp_path / "serve.err").read_text()  # what computes it
        client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        messages = [{"role": "user", "content": prompt}]
        full = client.chat.completions.create(model=model, messages=messages, max_tokens=n)
        assert full.choices[0].message.content == want
        assert full.usage.completion_tokens == int(re.search(r"tokens=(\d+)", gen.stderr).group(1))
        assert full.vskip["skipped_rounds"] == 0 and full.vskip["verifier_calls"] >= 1

        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=n, stream=True,
                                                stream_options={"include_usage": True})
        chunks = [next(iter(stream))]
        proc.send_signal(signal.SIGTERM)  # mid-stream: the stream still finishes
        chunks += list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
        assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        err.close()
