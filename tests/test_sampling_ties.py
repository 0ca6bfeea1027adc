"""benchmarks/sampling_ties.py: where a configuration that commits `ar`'s draws drew another token,
the float64 margin of that position's uniform number (on the embedded verifier)."""

import gzip
import json

import pytest
from scripts import load_script

pytestmark = pytest.mark.model
TID = "HumanEval/0"


def _compare_dir(where, rows: dict, sampling: dict):
    d = where / "cmp"
    d.mkdir(parents=True)
    configs = {c: {"decode": {"sampling": sampling}} for c in ("ar", "strict")}
    (d / "settings.json").write_text(json.dumps({"fixed": {"task": "humaneval", "models": {"verifier": None}},
                                                 "configs": configs}))
    lines = [{"task_id": t, "config": c, "tokens": toks, "generated_tokens": len(toks or [])}
             for t, by in rows.items() for c, toks in by.items()]
    with gzip.open(d / "shard-1-of-1.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in lines))
    return d


def test_a_neighbouring_draw_has_a_small_margin_and_a_far_one_a_large_one(tmp_path):
    """After the prompt of HumanEval/0 and token 1233, seed 0 and temperature 1 draw id 98 (its
    probability about 0.003) at position 1: the script must rebuild that draw in float64 from the
    prompt's key and the position (a wrong key or position would almost never land on it). A
    neighbouring id lies within 98's own mass of the uniform number; a far id does not."""
    ties = load_script("sampling_ties")
    s = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 0, "speculative": False}
    d = _compare_dir(tmp_path, {TID: {"ar": [1233, 98, 5], "strict": [1233, 97]},
                                "HumanEval/1": {"ar": [7, 8], "strict": [7, 8]}}, s)
    near = ties.ties(d, progress=False)
    assert (near["prompts"], near["equal"], near["differ"]) == (2, 1, 1)
    assert near["draws_compared"] == 2 + 2 and near["ties_per_draw"] == 1 / 4  # up to the difference; all of the equal
    row = near["rows"][0]
    assert (row["position"], row["ar"], row["strict"], row["float64"]) == (1, 98, 97, 98)
    assert 0 < row["margin"] <= row["p_ar"] < 0.01
    far = ties.ties(_compare_dir(tmp_path / "far", {TID: {"ar": [1233, 98], "strict": [1233, 40000]}}, s),
                    progress=False)["rows"][0]
    assert far["float64"] == 98 and far["margin"] > 10 * row["margin"]


def test_greedy_or_the_standard_rule_is_refused(tmp_path):
    ties = load_script("sampling_ties")
    for s in ({"temperature": 0.0}, {"temperature": 0.6, "speculative": True}):
        d = _compare_dir(tmp_path / str(len(s)), {TID: {"ar": [1], "strict": [2]}}, s)
        with pytest.raises(ValueError, match="does not commit ar's draws"):
            ties.ties(d, progress=False)
    s = {"temperature": 1.0}
    with pytest.raises(ValueError, match="rows without their output tokens"):
        ties.ties(_compare_dir(tmp_path / "bare", {TID: {"ar": None, "strict": [2]}}, s), progress=False)
    assert ties.first_difference([1, 2, 3], [1, 2]) is None and ties.first_difference([1, 2], [1, 3]) == 1
