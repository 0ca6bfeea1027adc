"""The pure policy: acceptance rules, confidence signals, gates, guards and the skip decision.

Plain numpy in, plain decisions out. This package never imports torch (a test checks it).
"""

from .acceptance import Verdict, committed_tokens, drawn_verdict, lenience_accept, strict_accept, topk_accept
from .blocks import BlockLength, block_length, verify_length
from .guards import GuardConfig, GuardContext, check_guards, invalid_scores, repetition
from .rule import RULE, Rule, accept
from .sampling import Draw, Sampling, draw_rows, prompt_key
from .schedule import DEFAULT_GATES, POLICIES, Decision, PolicyConfig, break_even_length, decide, policy_params
from .signals import LEARNED, SIGNALS, feasible_prefix, local_scores, prefix_scores, select_prefix

__all__ = [
    "BlockLength", "block_length", "verify_length",
    "Verdict", "committed_tokens", "drawn_verdict", "lenience_accept", "strict_accept", "topk_accept",
    "RULE", "Rule", "accept",
    "Draw", "Sampling", "draw_rows", "prompt_key",
    "GuardConfig", "GuardContext", "check_guards", "invalid_scores", "repetition",
    "DEFAULT_GATES", "POLICIES", "Decision", "PolicyConfig", "break_even_length", "decide",
    "policy_params",
    "SIGNALS", "LEARNED", "feasible_prefix", "local_scores", "prefix_scores", "select_prefix",
]

