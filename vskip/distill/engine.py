"""Greedy generation for distillation data, bound by throughput instead of latency.

A causal LM of the Llama/Qwen2 layout runs on :class:`~vskip.engine.models.backbone.Backbone` with a
key/value cache of fixed slots ``[slots, kv_heads, T, head_dim]`` per layer. Every step decodes
one token in every busy slot; a slot whose answer ended (eos or the token budget) is refilled at
once with the next prompt (continuous batching), so no row waits for the longest answer of its
batch, and nothing is concatenated or copied per step. Each prompt is prefilled alone (one
causal forward), its keys and values written into its slot.

The greedy token is the exact argmax of the float32 hidden state times the float32 head
(:class:`~vskip.engine.models.head.ExactHead`), so an answer is the verifier's own greedy answer up to
the rounding of the body's float32 arithmetic, which differs from transformers' kernels only in
the last bits; :func:`agreement` measures how often that flips a token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch

from ..engine.models.backbone import Backbone, BackboneConfig, read_hf_config, rope_tables, rotate_half
from ..engine.models.head import ExactHead

#: the cache grows in steps of this many positions
GROW = 128


@dataclass
class Answer:
    """One finished generation: the caller's key, the prompt ids, the generated ids (up to and
    including eos when one was generated) and whether eos ended it."""

    key: object
    prompt: list[int]
    completion: list[int]
    finished: bool


def load_causal_lm(path: Path | str) -> tuple[Backbone, torch.Tensor]:
    """The body and the float32 output head ``[V, d]`` of a Llama/Qwen2-layout checkpoint."""
    from ..engine.models.drafter_io import backbone_state_from_hf

    path = Path(path)
    cfg = read_hf_config(path)
    if cfg.get("model_type") not in ("llama", "qwen2", "mistral"):
        raise ValueError(f"{path}: model type {cfg.get('model_type')!r} is not of the Llama/Qwen2 layout")
    bb = BackboneConfig.from_hf(cfg)
    model = Backbone(bb)
    sd = backbone_state_from_hf(path, bb.num_layers)
    head = sd.pop("lm_head.weight", None)
    model.load_state_dict({k: v.float() for k, v in sd.items()})
    model.eval().requires_grad_(False)
    if head is None:
        if not cfg.get("tie_word_embeddings", False):
            raise ValueError(f"{path}: no lm_head.weight and the embeddings are not tied")
        head = model.embed_tokens.weight
    return model, head.float().contiguous()


class SlotEngine:
    """Continuous-batching greedy decoding of many prompts with one model."""

    def __init__(self, model: Backbone, head: torch.Tensor | ExactHead, slots: int, max_new_tokens: int,
                 eos_id: int, group: int = 8, max_len: int = 1280):
        if slots < 1 or max_new_tokens < 1:
            raise ValueError("slots and max_new_tokens must be positive")
        self.model, self.c = model, model.config
        self.head = head if isinstance(head, ExactHead) else ExactHead(head, screen=torch.float32)
        self.slots, self.max_new, self.eos = slots, max_new_tokens, eos_id
        #: slots per attention group: a group attends over its own longest cache, not the batch's
        self.group = max(1, group)
        #: the cache holds this many positions per slot at most (memory: slots x max_len x 46 kB
        #: for the embedded verifier); a longer prompt is answered alone, in a cache of its own
        self.max_len = max(max_len, max_new_tokens + 1)
        self.T = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.steps = 0  # decode steps run
        self.busy_steps = 0  # slot-steps that produced a kept token

    def _ensure(self, length: int) -> None:
        """Grow every slot's cache to hold ``length`` positions (copying what it holds, one layer
        at a time, so that the old and the new cache never coexist whole)."""
        if length <= self.T:
            return
        T = max(length, min(-(-length // GROW) * GROW, self.max_len))
        c = self.c
        shape = (self.slots, c.num_kv_heads, T, c.head_dim)
        for store in (self.k, self.v):
            if not store:
                store.extend(torch.zeros(shape) for _ in range(c.num_layers))
                continue
            for i in range(c.num_layers):
                grown = torch.zeros(shape)
                grown[:, :, : self.T] = store[i]
                store[i] = grown
        self.T = T

    def _alone(self, key, ids: list[int]) -> "Answer":
        """The answer to a prompt too long for the shared cache, from a one-slot engine."""
        solo = SlotEngine(self.model, self.head, 1, self.max_new, self.eos, max_len=len(ids) + self.max_new)
        (answer,) = list(solo.run([(key, ids)]))
        self.steps += solo.steps
        self.busy_steps += solo.busy_steps
        return answer

    def _prefill(self, slot: int, ids: Sequence[int]) -> int:
        """Encode a prompt into ``slot``; returns its first greedy token."""
        x = self.model.embed_tokens(torch.tensor([list(ids)]))
        hidden, presents = self.model(x, torch.arange(len(ids)), mask="causal")
        for i, (k, v) in enumerate(presents):
            self.k[i][slot, :, : len(ids)] = k[0]
            self.v[i][slot, :, : len(ids)] = v[0]
        return int(self.head(hidden[0, -1:])[0][0])

    def _step(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One token per slot (``tokens`` [S] at positions ``pos`` [S]); returns the next [S].

        Attention is two batched products per layer and group of slots over their caches (views,
        never copied or expanded), the query heads of a key/value head grouped together; a group
        reads only as far as its longest sequence, so one long prompt slows only its own group."""
        c, S = self.c, self.slots
        hd, h, kvh = c.head_dim, c.num_heads, c.num_kv_heads
        g = h // kvh
        width = int(pos.max()) + 1
        G = self.group
        spans = [(a, min(a + G, S), int(pos[a : a + G].max()) + 1) for a in range(0, S, G)]
        bias = torch.zeros(S, width).masked_fill_(torch.arange(width)[None] > pos[:, None], float("-inf"))
        bias = bias.view(S, 1, 1, width)
        cos, sin = rope_tables(pos[:, None], hd, c.rope_theta, torch.float32)  # [S, 1, 1, hd]
        rows = torch.arange(S)
        scale = hd**-0.5
        x = self.model.embed_tokens(tokens[:, None])  # [S, 1, d]
        for i, layer in enumerate(self.model.layers):
            att = layer.self_attn
            y = layer.input_layernorm(x)
            q = att.q_proj(y).view(S, h, 1, hd)
            k = att.k_proj(y).view(S, kvh, 1, hd)
            v = att.v_proj(y).view(S, kvh, 1, hd)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.k[i][rows, :, pos] = k[:, :, 0]
            self.v[i][rows, :, pos] = v[:, :, 0]
            qg = q.view(S, kvh, g, hd) * scale
            o = torch.empty(S, kvh, g, hd)
            for a, b, w in spans:  # each group of slots reads only as far as its longest
                K, V = self.k[i][a:b, :, :w], self.v[i][a:b, :, :w]  # [n, kvh, w, hd], views
                p = torch.softmax(torch.matmul(qg[a:b], K.transpose(2, 3)) + bias[a:b, ..., :w], dim=-1)
                o[a:b] = torch.matmul(p, V)
            x = x + att.o_proj(o.reshape(S, 1, h * hd))  # heads in q's order
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        hidden = self.model.norm(x)[:, 0]
        self.steps += 1
        return self.head(hidden)[0]

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
        tokens = torch.zeros(S, dtype=torch.long)
        pos = torch.zeros(S, dtype=torch.long)

        def fill(s: int) -> Iterator[Answer]:
            # the next prompt into slot s; prompts answered by their prefill alone finish here
            for item in queue:
                kk, ids = item
                ids = [int(t) for t in ids]
                if not ids:
                    raise ValueError(f"empty prompt {kk!r}")
                if len(ids) + self.max_new > self.max_len:
                    yield self._alone(kk, ids)
                    continue
                self._ensure(len(ids) + self.max_new)
                first = self._prefill(s, ids)
                if on_token:
                    on_token()
                if first == self.eos or self.max_new == 1:
                    yield Answer(kk, ids, [first], first == self.eos)
                    continue
                key[s], prompt[s], out[s], busy[s] = kk, ids, [first], True
                tokens[s], pos[s] = first, len(ids)
                return
            busy[s] = False

        for s in range(S):
            yield from fill(s)
        while any(busy):
            nxt = self._step(tokens, pos)
            for s in range(S):
                if not busy[s]:
                    continue
                t = int(nxt[s])
                out[s].append(t)
                self.busy_steps += 1
                if on_token:
                    on_token()
                if t == self.eos or len(out[s]) >= self.max_new:
                    yield Answer(key[s], prompt[s], out[s], t == self.eos)
                    yield from fill(s)
                else:
                    tokens[s], pos[s] = t, pos[s] + 1
            # idle slots decode garbage at position 0; keep them harmless
            for s in range(S):
                if not busy[s]:
                    tokens[s], pos[s] = 0, 0
