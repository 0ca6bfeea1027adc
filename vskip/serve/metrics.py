"""The server's Prometheus metrics (prometheus-client), in a registry of the server's own.

Where a metric means what one of vLLM's means, it takes vLLM's name with the ``vskip:`` prefix in
place of ``vllm:`` (``vskip:num_requests_running``, ``vskip:spec_decode_num_drafts_total``, ...), so
a dashboard built for vLLM reads it with the prefix changed. The speculative counters count what
the verifier judged (verified rounds); what verifier skipping adds has names of its own:
``vskip:skipped_rounds_total``, ``vskip:verifier_calls_total``, ``vskip:relaxed_tokens_total``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

disable_created_metrics()  # the *_created series say nothing a scrape needs

_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
_PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)


class Metrics:
    """Every metric of one server, labelled with the served model's name."""

    def __init__(self, model_name: str, max_batch: int, max_position: int):
        self.registry = r = CollectorRegistry()
        lab = ["model_name"]

        def counter(name, doc, extra=()):
            return Counter(name, doc, lab + list(extra), registry=r)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, lab, buckets=buckets, registry=r)

        self.running = Gauge("vskip:num_requests_running", "Requests decoding in the batch.", lab, registry=r)
        self.waiting = Gauge("vskip:num_requests_waiting", "Requests waiting for a slot.", lab, registry=r)
        self.drafts = counter("vskip:spec_decode_num_drafts", "Drafted blocks the verifier judged.")
        self.draft_tokens = counter("vskip:spec_decode_num_draft_tokens", "Drafted tokens the verifier judged.")
        self.accepted = counter("vskip:spec_decode_num_accepted_tokens", "Drafted tokens the verifier accepted.")
        self.accepted_pos = counter("vskip:spec_decode_num_accepted_tokens_per_pos",
                                    "Drafted tokens accepted, by their position in the block.", ["position"])
        self.skipped = counter("vskip:skipped_rounds", "Rounds that committed a drafted prefix without the verifier.")
        self.calls = counter("vskip:verifier_calls", "Verifier calls (verified rounds, and ar steps).")
        self.relaxed = counter("vskip:relaxed_tokens",
                               "Tokens committed by a relaxed rule: skipped prefixes, lenience or top-k acceptance.")
        self.prompt_tokens = counter("vskip:prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens = counter("vskip:generation_tokens", "Generated tokens.")
        self.finished = counter("vskip:request_success", "Finished requests, by finish reason.", ["finished_reason"])
        self.rejected = counter("vskip:request_rejected", "Requests refused at once: full queue or draining.",
                                ["reason"])
        self.batch = histogram("vskip:batch_size", "Sequences in a round of the decode loop.",
                               tuple(float(b) for b in _powers(max_batch)))
        self.queue = histogram("vskip:request_queue_time_seconds", "Time a request waited for a slot.", _LATENCY)
        self.ttft = histogram("vskip:time_to_first_token_seconds", "Time from arrival to the first token.", _LATENCY)
        self.prefill = histogram("vskip:request_prefill_time_seconds",
                                 "Time from admission to the first token (the prompt's prefill and first round).", _LATENCY)
        self.itl = histogram("vskip:inter_token_latency_seconds",
                             "Time between two deliveries of tokens to a request (one per round that commits any).",
                             _PER_TOKEN)
        self.decode = histogram("vskip:request_decode_time_seconds", "Time from the first token to the last.", _LATENCY)
        self.tpot = histogram("vskip:time_per_output_token_seconds",
                              "Time per output token after the first, per request.", _PER_TOKEN)
        self.e2e = histogram("vskip:e2e_request_latency_seconds", "Time from arrival to the last token.", _LATENCY)
        self.model = model_name
        self.max_position = max_position

    def of(self, metric, **labels):
        return metric.labels(model_name=self.model, **labels)

    def round(self, n_active: int, records) -> None:
        """One round of the loop over ``n_active`` sequences, with each sequence's round record."""
        self.of(self.batch).observe(n_active)
        for rec in records:
            if rec.verified:
                self.of(self.calls).inc()
                if rec.gamma > 0:
                    self.of(self.drafts).inc()
                    self.of(self.draft_tokens).inc(rec.gamma)
                    self.of(self.accepted).inc(rec.accepted)
                    for i in range(min(rec.accepted, self.max_position)):
                        self.of(self.accepted_pos, position=str(i)).inc()
            else:
                self.of(self.skipped).inc()
            if rec.relaxed:
                self.of(self.relaxed).inc(rec.accepted)
            self.of(self.generation_tokens).inc(rec.committed)


def _powers(n: int) -> list[int]:
    out, b = [], 1
    while b < n:
        out.append(b)
        b *= 2
    return out + [n]
