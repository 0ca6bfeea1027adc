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


def test_the_prompt_once_equals_one_forward_per_completion():
    """Completions of one prompt, of several lengths (an empty one and a one-token one among them),
    each on the prompt's cache cropped back after the one before: each one's logits are those of
    its own full forward (a cache left uncropped would show at once)."""
    from test_models import tiny_llama

    fid = load_script("sampling_fidelity")
    model = tiny_llama(seed=3)
    prompt = [5, 17, 3, 44, 9, 60, 2]
    comps = [[7, 8, 9, 10, 11, 12], [], [30], [1, 2, 3], [90, 91, 92, 93, 94, 95, 0, 4, 5]]
    got = fid.teacher_forced_logits(model, prompt, comps)
    assert [g.shape[0] for g in got] == [len(c) for c in comps]
    for c, g in zip(comps, got):
        if c:
            with torch.inference_mode():
                want = model(input_ids=torch.tensor([prompt + c[:-1]])).logits[0, len(prompt) - 1:]
            torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)


def test_bad_input_is_one_line_before_any_model_loads(tmp_path, capsys):
    fid = load_script("sampling_fidelity")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "HumanEval/999", "tokens": [1, 2]}\n')
    assert fid.main(["--task", "humaneval", "--temperature", "0.6", "--files", "a", str(bad)]) == 2
    assert "'HumanEval/999' is not a humaneval task" in capsys.readouterr().err
    assert fid.main(["--task", "humaneval", "--temperature", "0.6", "--files", "a", str(tmp_path / "no")]) == 2
    assert "does not exist" in capsys.readouterr().err
