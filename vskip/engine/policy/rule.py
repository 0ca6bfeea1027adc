"""The acceptance rule of a verified round, in one place.

The verifier only scores: its argmax, logit gaps and ranks (greedy), or its warped distributions
(sampled). A :class:`Rule` turns that into a :class:`~vskip.engine.policy.acceptance.Verdict` (the
verifier's token at each position: its argmax, its coupled draw, or the draws of the standard
min(1, p/q) rule) and then into the number of drafted tokens the policy accepts (strict,
lenience, top-k). The decode loop holds one rule; research code passes another to
:func:`vskip.engine.decode.decode` (a test of a wrong rule swaps the rule, never the verifier).
"""

from __future__ import annotations

import numpy as np

from .acceptance import Verdict, drawn_verdict, lenience_accept, strict_accept, topk_accept
from .sampling import Draw, draw_rows, speculative_draws


class Rule:
    """The paper's acceptance rules and the two sampled ones (:mod:`vskip.engine.policy.sampling`)."""

    def verdict(self, scores: Verdict | np.ndarray, draw: Draw | None) -> Verdict:
        """``scores``: the verifier's greedy verdict (``draw`` None), or its warped distributions
        [n + 1, V] at the block's positions and after it, judged with ``draw``'s numbers: the
        verifier's own draws (coupled: a drafted token is kept when it equals the draw), or under the
        speculative rule the tokens of :func:`speculative_draws`."""
        if draw is None:
            assert isinstance(scores, Verdict), type(scores)
            return scores
        if draw.speculative:
            return drawn_verdict(speculative_draws(np.asarray(scores), draw))
        return drawn_verdict(draw_rows(scores, draw.u))

    def accept(self, cfg, draft: np.ndarray, verdict: Verdict) -> int:
        """The accepted draft length under the method's rule (``cfg``: a
        :class:`~vskip.engine.policy.schedule.PolicyConfig`)."""
        if cfg.name == "lenience":
            return lenience_accept(draft, verdict, cfg.lenience)
        if cfg.name == "topk":
            return topk_accept(draft, verdict, cfg.top_k)
        return strict_accept(draft, verdict)


#: the rule every decode uses unless given another
RULE = Rule()


def accept(cfg, draft, verdict: Verdict) -> int:
    """Accepted draft length of a verified round under the method's acceptance rule."""
    return RULE.accept(cfg, draft, verdict)
