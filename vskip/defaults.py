"""Defaults every command shares, defined once.

``GAMMA`` and ``STEPS`` are the fastest lossless Strict SDD configuration of the embedded pair on
a CPU (docs/results/speed.md); the drafter runs in bfloat16 where the device has it natively
(:func:`vskip.runtime.resolve_runtime`). The paper's main setting is gamma 32 with two reveal
steps (§5.1): pass ``--gamma 32 --steps 2`` for it.
"""

#: draft block length
GAMMA = 8
#: reveal (denoising) steps per draft block
STEPS = 1
#: the paper's minimum skip length and staleness threshold (§5.1)
K_MIN = 6
S_MAX = 64
#: the longest draft block accepted (the paper uses 32); longer blocks only cost memory and time
MAX_GAMMA = 512
#: the largest seed a flag takes (numpy's seed sequences take any non-negative integer)
MAX_SEED = 2**32 - 1
#: the output budget of every decode unless --max-new-tokens says otherwise (the paper's 512)
MAX_NEW_TOKENS = 512
#: the decoding methods (``--policy``); defined here so that the command line needs no numpy
POLICIES = ("ar", "strict", "lenience", "topk", "periodic", "raw", "marginal", "conditional", "prefix")
#: named decoding shapes (``--preset``): the drafter (None: the embedded standalone drafter), the
#: block length and the reveal steps a command starts from; explicit flags override them
PRESETS = {
    "default": {"drafter": None, "gamma": GAMMA, "steps": STEPS},
    "paper": {"drafter": "smollm2-135m-diffusion", "gamma": 32, "steps": 2},
}
