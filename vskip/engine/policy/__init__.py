"""The pure policy: acceptance rules, confidence signals, gates, guards and the skip decision.

Plain numpy in, plain decisions out. This package never imports torch (a test checks it).
"""

from .acceptance import Verdict, committed_tokens, lenience_accept, sampled_verdict, strict_accept, topk_accept
from .blocks import BlockLength, block_length, verify_length
from .guards import GuardConfig, GuardContext, check_guards, invalid_scores, repetition
from .sampling import Draw, Sampling, prompt_key
from .schedule import DEFAULT_GATES, POLICIES, Decision, PolicyConfig, break_even_length, decide, policy_params
from .signals import LEARNED, SIGNALS, feasible_prefix, local_scores, prefix_scores, select_prefix

__all__ = [
    "BlockLength", "block_length", "verify_length",
    "Verdict", "committed_tokens", "lenience_accept", "sampled_verdict", "strict_accept", "topk_accept",
    "Draw", "Sampling", "prompt_key",
    "GuardConfig", "GuardContext", "check_guards", "invalid_scores", "repetition",
    "DEFAULT_GATES", "POLICIES", "Decision", "PolicyConfig", "break_even_length", "decide",
    "policy_params",
    "SIGNALS", "LEARNED", "feasible_prefix", "local_scores", "prefix_scores", "select_prefix",
]


def accept(cfg: PolicyConfig, draft, verdict: Verdict) -> int:
    """Accepted draft length of a verified round under the method's acceptance rule."""
    if cfg.name == "lenience":
        return lenience_accept(draft, verdict, cfg.lenience)
    if cfg.name == "topk":
        return topk_accept(draft, verdict, cfg.top_k)
    return strict_accept(draft, verdict)


__all__.append("accept")
