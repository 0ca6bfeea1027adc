"""benchmarks/sampling_fidelity.py: the score log p(x) + H(p) of each drawn token, whose sum over
a sampler of p stays near 0 in units of its standard deviation, and leaves it for a sampler of
another distribution."""

import math

import numpy as np
import pytest
import torch
from scripts import load_script

from vskip.engine.policy import Sampling


def test_the_scores_of_a_small_distribution_by_hand():
    fid = load_script("sampling_fidelity")
    p = np.array([0.5, 0.25, 0.25, 0.0])
    logits = torch.from_numpy(np.log(np.maximum(p, 1e-300)))[None]
    logits[0, 3] = -math.inf
    drawn, neg_h, var = fid.scores(logits.repeat(2, 1), torch.tensor([1, 3]), Sampling(temperature=1.0))
    h = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert drawn[0] == pytest.approx(math.log(0.25)) and neg_h[0] == pytest.approx(-h)
    assert var[0] == pytest.approx(0.5 * math.log(0.5) ** 2 + 0.5 * math.log(0.25) ** 2 - h**2)
    assert np.isneginf(drawn[1])  # no sampler of p draws a token without mass


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_z_stays_near_zero_for_a_sampler_of_p_and_leaves_for_another(seed):
    """Draw 4000 tokens from warped p (temperature 0.6) and from a sampler that slightly favours
    each row's top token (a quarter of the time it takes the argmax instead): the first z is within a
    few units of 0, the second far above."""
    fid = load_script("sampling_fidelity")
    rng = np.random.default_rng(seed)
    s = Sampling(temperature=0.6)
    logits = torch.tensor(rng.normal(size=(4000, 50)) * 2.0)
    from vskip.engine.models.sampling import warped_probs

    p = warped_probs(logits, s).numpy()
    exact = np.array([rng.choice(50, p=row) for row in p])
    biased = np.where(rng.random(4000) < 0.25, p.argmax(-1), exact)

    def z(tokens):
        d, h, v = fid.scores(logits, torch.tensor(tokens), s)
        return (d - h).sum() / math.sqrt(v.sum())

    assert abs(z(exact)) < 4.0
    assert z(biased) > 6.0
