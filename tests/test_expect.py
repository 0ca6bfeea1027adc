"""``vskip expect``: the costs that decide Strict SDD's speed-up on this machine, and Eq. 7 with a
committed A."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import FakeDrafter, FakeVerifier

from vskip.study.expect import TOKENS_PER_CALL, expected_vs_ar, measure


def test_the_costs_are_measured_on_the_text_with_its_context_cached():
    class Counting(FakeVerifier):
        def score_many(self, calls):
            self.blocks = getattr(self, "blocks", []) + [len(c.block) for c in calls]
            return super().score_many(calls)

    v = Counting()
    c = measure(FakeDrafter(), v, list(range(2, 40)), gamma=6, reps=3)
    assert c["gamma"] == 6 and all(c[k] > 0 for k in ("c_V1", "c_Vg", "c_D"))
    assert v.blocks == [0] + [0] * 3 + [6] * 3  # the context, then steps, then verifications of the text's next 6
    with pytest.raises(ValueError, match="needs 8"):
        measure(FakeDrafter(), FakeVerifier(), [2, 3, 4], gamma=6)


def test_eq7_expects_a_over_what_a_round_costs_in_steps():
    assert expected_vs_ar({"c_V1": 0.05, "c_Vg": 0.07, "c_D": 0.01}, 3.0) == pytest.approx(3.0 * 0.05 / 0.08)
    assert expected_vs_ar({"c_V1": 0.05, "c_Vg": 0.10, "c_D": 0.01}, 3.0) < 1.5  # a slow verification gains less


def test_the_committed_a_is_the_studys():
    s = json.loads((Path(__file__).parents[1] / "docs/results/speed/he164/summary.json").read_text())
    assert round(s["configs"]["strict"]["tokens_per_call"], 4) == TOKENS_PER_CALL


@pytest.mark.model
def test_vskip_expect_on_the_embedded_pair():
    run = lambda *args: subprocess.run([sys.executable, "-m", "vskip", "expect", "--device", "cpu", "--threads", "1",  # noqa: E731
                                        *args], capture_output=True, text=True, timeout=300)
    out = run()
    assert out.returncode == 0, out.stderr
    assert "c_V(9)" in out.stdout and "x ar on this machine" in out.stdout and "Machine: " in out.stdout
    other = run("--gamma", "4")
    assert other.returncode == 0 and "give --tokens-per-call" in other.stdout and "x ar" not in other.stdout
    mine = run("--gamma", "4", "--tokens-per-call", "2.5")
    assert "A = 2.500 tokens per call (given)" in mine.stdout
