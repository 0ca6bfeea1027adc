"""Greedy generation for distillation data, bound by throughput instead of latency.

The verifier runs on the native runtime (:class:`~vskip.engine.models.native.model.Transformer`,
the one inference body) over one slot cache: every step decodes one token in every busy slot in
one forward; a slot whose answer ended (eos or the token budget) is refilled at once with the next
prompt (continuous batching), so no row waits for the longest answer of its batch. Each prompt is
prefilled alone (one forward over its tokens), its keys written into its slot.

The kernels compute a row the same way whatever else a forward holds, so an answer here is, token
for token, the native verifier's own greedy answer (what ``vskip generate --policy ar`` prints on
the native runtime); :func:`~vskip.distill.generate.check_agreement` measures how often it differs
from float32 transformers' greedy answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch


@dataclass
class Answer:
    """One finished generation: the caller's key, the prompt ids, the generated ids (up to and
    including eos when one was generated) and whether eos ended it."""

    key: object
    prompt: list[int]
    completion: list[int]
    finished: bool


def load_causal_lm(path: Path | str, threads: int | None = None):
    """The verifier of ``path`` (a checkpoint directory, a ``.gguf`` file, or the directory the
    embedded verifier is read from) on the native runtime."""
    from ..engine.models.source import native_net

    return native_net(str(path), threads)


class SlotEngine:
    """Continuous-batching greedy decoding of many prompts with one native model."""

    def __init__(self, net, slots: int, max_new_tokens: int, eos_id: int):
        if slots < 1 or max_new_tokens < 1:
            raise ValueError("slots and max_new_tokens must be positive")
        self.net = net
        self.slots, self.max_new, self.eos = slots, max_new_tokens, eos_id
        self.cache = net.new_cache(slots)
        self.steps = 0  # decode steps run
        self.busy_steps = 0  # slot-steps that produced a kept token

    def _prefill(self, slot: int, ids: Sequence[int]) -> int:
        """Encode a prompt into ``slot``; returns its first greedy token."""
        if len(ids) + self.max_new > self.net.shape.max_positions:
            raise ValueError(f"a prompt of {len(ids)} tokens and {self.max_new} new ones exceed the verifier's "
                             f"context of {self.net.shape.max_positions}")
        self.cache.keep(slot, 0)
        _, z = self.net.forward(self.cache, [slot] * len(ids), list(ids), list(range(len(ids))),
                                out_rows=[len(ids) - 1])
        self.cache.wrote(slot, 0, ids)
        return int(z[0].argmax())

    def _step(self, busy: list[int], tokens: list[int], pos: list[int]) -> list[int]:
        """One token in each busy slot (``tokens`` at positions ``pos``); returns the next ones."""
        _, z = self.net.forward(self.cache, busy, tokens, pos)
        self.steps += 1
        return z.argmax(-1).tolist()

    @torch.inference_mode()
    def run(self, prompts: Iterable[tuple[object, Sequence[int]]],
            on_token: Callable[[], None] | None = None) -> Iterator[Answer]:
        """Greedy answers to ``(key, prompt ids)`` pairs, yielded as they finish (not in order)."""
        queue = iter(prompts)
        S = self.slots
        key: list = [None] * S
        prompt: list[list[int]] = [[] for _ in range(S)]
        out: list[list[int]] = [[] for _ in range(S)]
        busy = [False] * S

        def fill(s: int) -> Iterator[Answer]:
            # the next prompt into slot s; prompts answered by their prefill alone finish here
            for kk, ids in queue:
                ids = [int(t) for t in ids]
                if not ids:
                    raise ValueError(f"empty prompt {kk!r}")
                first = self._prefill(s, ids)
                if on_token:
                    on_token()
                if first == self.eos or self.max_new == 1:
                    yield Answer(kk, ids, [first], first == self.eos)
                    continue
                key[s], prompt[s], out[s], busy[s] = kk, ids, [first], True
                return
            busy[s] = False

        for s in range(S):
            yield from fill(s)
        while any(busy):
            live = [s for s in range(S) if busy[s]]
            nxt = self._step(live, [out[s][-1] for s in live], [len(prompt[s]) + len(out[s]) - 1 for s in live])
            for s, t in zip(live, nxt):
                out[s].append(t)
                self.busy_steps += 1
                if on_token:
                    on_token()
                if t == self.eos or len(out[s]) >= self.max_new:
                    yield Answer(key[s], prompt[s], out[s], t == self.eos)
                    yield from fill(s)
