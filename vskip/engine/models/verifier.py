"""The verifier adapter: any transformers causal LM, with a KV cache that follows the committed
sequence, or the paper's no-cache mode that recomputes the full sequence every call (A.8).

The output head: for float32 models whose logits are a plain linear map of the last hidden state,
the head is :class:`~vskip.engine.models.head.ExactHead` (a bfloat16 screen with a rigorous error bound,
then the surviving candidates in float64): cheaper, exact, and the same whatever the number of
positions a call scores. ``exact_head=False`` keeps the model's own head.

Cache discipline: before each call the cache is cropped to the longest prefix it shares with the
new input (and never past the last committed token, whose logits are needed), then the rest —
tokens committed by skips included — is prefilled in the same forward as the block. A shadow call
(§3.2) crops the cache back afterwards, so it leaves nothing a later call could profit from.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..policy import Sampling, Verdict  # data types only
from .head import ExactHead, plain_head
from .protocols import common_prefix
from .sampling import warped_probs


def _crop(cache, n: int) -> None:
    """Keep the first ``n`` positions of a transformers cache (``crop`` takes a count to drop)."""
    drop = cache.get_seq_length() - n
    if drop > 0:
        cache.crop(-drop)


def _cache_kwarg(model) -> str:
    """transformers renamed ``past_key_values`` to ``cache``; use whichever this version takes."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class HFVerifier:
    def __init__(
        self,
        model,
        eos_ids: Sequence[int],
        special_ids: Sequence[int] = (),
        use_cache: bool = True,
        max_length: int | None = None,
        exact_head: bool = True,
    ):
        self.model = model.eval()
        self.use_cache = use_cache
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.special_ids = frozenset(int(i) for i in special_ids) - self.eos_ids
        cfg = model.config
        self.vocab_size = int(cfg.vocab_size)
        self.max_length = int(max_length or getattr(cfg, "max_position_embeddings", 1 << 30))
        # inputs go where the embedding is; a model spread over devices (accelerate's device_map)
        # moves activations between them itself, and its outputs come back once per call
        self.device = model.get_input_embeddings().weight.device
        self._cache_arg = _cache_kwarg(model)
        head = plain_head(model) if exact_head else None
        self.head = ExactHead(head.weight) if head is not None else None
        self.taps: list = []
        self._hooked: set[int] = set()
        self._grabbed: dict[int, torch.Tensor] = {}
        self.reset()

    def reset(self) -> None:
        self._cache = None
        self._cached_ids: list[int] = []
        for tap in self.taps:
            tap.reset()

    @property
    def vocabulary(self) -> int:
        return self.vocab_size

    def set_tap(self, tap) -> None:
        """Hand the hidden states of the layers ``tap.layers`` (layer i: transformers'
        ``hidden_states[i + 1]``, the output of decoder layer i, final-normed for the last) of
        every position a real call runs over to ``tap``
        (:class:`~vskip.engine.models.conditioned.HiddenTap`), beside any tap set before; a shadow call
        leaves every tap as it was."""
        layers = self.model.model.layers
        bad = [i for i in tap.layers if not 0 <= i < len(layers)]
        if bad:
            raise ValueError(f"the drafter reads verifier layers {bad}, but the verifier has {len(layers)} layers")

        def grab(i):
            last = i == len(layers) - 1  # transformers' hidden_states[-1] is the final-normed state

            def fn(_module, _inp, out):
                h = out[0] if isinstance(out, tuple) else out
                self._grabbed[i] = self.model.model.norm(h) if last else h
            return fn

        for i in sorted(set(tap.layers) - self._hooked):
            layers[i].register_forward_hook(grab(i))
            self._hooked.add(i)
        self.taps.append(tap)
        tap.reset()

    @torch.inference_mode()
    def prefill(self, ids) -> None:
        """Run over ``ids`` (committed tokens) so that the cache and the tap hold them."""
        ids = [int(t) for t in ids]
        if ids:
            self._forward(ids, 1)

    def set_cache(self, on: bool) -> None:
        """Keep a KV cache (on) or recompute the whole sequence every call (off, as the paper)."""
        self.use_cache = bool(on)
        self.reset()

    def warmup(self, seq, gamma) -> None:
        self.score(list(seq), [0] * gamma)
        self.reset()

    def _forward(self, ids: list[int], keep: int) -> torch.Tensor:
        """Outputs [keep, ...] of the last ``keep`` positions of ``ids``: final hidden states when
        the exact head is used, logits otherwise."""
        base = self.model.model if self.head is not None else self.model
        kw = {} if self.head is not None else {"logits_to_keep": keep}
        if not self.use_cache:
            x = torch.tensor([ids], device=self.device)
            out = base(input_ids=x, use_cache=False, **kw)
            self._hand_over(0, ids)
            return self._output(out)[0, -keep:]
        from transformers import DynamicCache

        n = min(common_prefix(self._cached_ids, ids), len(ids) - keep)
        if self._cache is None:
            self._cache = DynamicCache(config=self.model.config)
            n = 0
        else:
            _crop(self._cache, n)
        x = torch.tensor([ids[n:]], device=self.device)
        pos = torch.arange(n, len(ids), device=self.device)[None]
        kw[self._cache_arg] = self._cache
        out = base(input_ids=x, use_cache=True, position_ids=pos, **kw)
        self._cached_ids = list(ids)
        self._hand_over(n, ids)
        return self._output(out)[0, -keep:]

    def _hand_over(self, start: int, ids: list[int]) -> None:
        """Give the tap the hidden states of positions ``start ..`` that this forward computed."""
        for tap in self.taps:
            tap.put(start, ids, torch.cat([self._grabbed[i][0] for i in tap.layers], dim=-1))
        self._grabbed.clear()

    def _output(self, out) -> torch.Tensor:
        return out.last_hidden_state if self.head is not None else out.logits

    def _run(self, seq: Sequence[int], block: Sequence[int], shadow: bool) -> torch.Tensor:
        """Final hidden states (exact head) or logits of the block's positions and the one after
        it [len(block) + 1, ...], on the head's device; a shadow call restores the cache and the
        taps as it found them."""
        seq = [int(t) for t in seq]
        block = [int(t) for t in block]
        # What the cache could still serve before this call: a shadow call restores exactly that.
        reusable = common_prefix(self._cached_ids, seq + block) if shadow else 0
        tapped = [tap.covered(seq + block) for tap in self.taps] if shadow else []
        out = self._forward(seq + block, len(block) + 1)  # [g+1, d] hidden states or [g+1, V] logits
        if shadow and self.use_cache and self._cache is not None:
            _crop(self._cache, reusable)
            self._cached_ids = self._cached_ids[:reusable]
        for tap, n in zip(self.taps, tapped):  # the skipped tokens stay without features
            tap.keep(n)
        return out.to(self.head.device) if self.head is not None else out

    @torch.inference_mode()
    def score(self, seq: Sequence[int], block: Sequence[int], shadow: bool = False) -> Verdict:
        out = self._run(seq, block, shadow)
        g = len(block)
        b = torch.tensor([int(t) for t in block], dtype=torch.long, device=out.device)
        if self.head is not None:
            argmax, gap, rank_fn = self.head(out, b if g else None)
            rank = lambda: rank_fn().cpu().numpy().astype(np.int64)  # noqa: E731 - computed on demand
        else:
            argmax, gap, r = _plain_verdict(out.float(), b)
            rank = r.cpu().numpy().astype(np.int64)
        return Verdict(
            argmax.cpu().numpy().astype(np.int64),
            draft_gap=gap.cpu().numpy().astype(np.float64),
            draft_rank=rank,
        )

    @torch.inference_mode()
    def distributions(self, seq: Sequence[int], block: Sequence[int], sampling: Sampling,
                      shadow: bool = False) -> np.ndarray:
        out = self._run(seq, block, shadow)
        logits = out.float() @ self.head.weight.T if self.head is not None else out.float()
        return warped_probs(logits, sampling).cpu().numpy()


def _plain_verdict(logits: torch.Tensor, block: torch.Tensor):
    """Argmax [g+1], drafted-token gap [g] and rank [g] from full logits [g+1, V]."""
    argmax = logits.argmax(-1)
    if not block.numel():
        return argmax, torch.zeros(0), torch.zeros(0, dtype=torch.long)
    z = logits[:-1]
    zd = z.gather(1, block[:, None])[:, 0]
    return argmax, zd - z.max(-1).values, (z > zd[:, None]).sum(-1)
