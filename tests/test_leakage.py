"""Leakage by similarity: reworded evaluation items planted among training prompts are flagged,
unrelated prompts are not, and training and the copy prior's fit skip what is flagged."""

import json
from pathlib import Path

import numpy as np
import pytest

from vskip.distill import generate as gen
from vskip.distill import leakage
from vskip.distill.prompts import CODEIO_TEMPLATE, MATH_TEMPLATE, TrainPrompt


def _codeio(pid: str, description: str, key: str = "result") -> TrainPrompt:
    spec = f"Input:\n    n (int): a number.\n\nOutput:\n    return (dict): A dictionary with one key:\n    - {key} (int): the answer."
    return TrainPrompt("codeio", pid, CODEIO_TEMPLATE.format(description=description, spec=spec, signature="main_solution(n)"))


PLANTED = {
    # HumanEval/59 in other words, naming its function
    "planted/he59": _codeio("planted/he59", "You are handed an integer `n` greater than one that is not prime. Work out "
                            "the biggest prime number dividing `n` and return it.", key="largest_prime_factor"),
    # MBPP/123 reworded, no shared name
    "planted/mbpp123": _codeio("planted/mbpp123", "Given a positive integer, what is the sum of all the amicable "
                               "numbers under this integer?"),
    # MATH-500/158 with another number
    "planted/math158": TrainPrompt("math", "planted/math158", MATH_TEMPLATE.format(
        problem="What is the sum of all of the multiples of 9 between 100 and 200?")),
}
CONTROLS = [
    _codeio("control/csv", "Parse a CSV line with quoted fields and return the number of columns."),
    TrainPrompt("math", "control/geo", MATH_TEMPLATE.format(
        problem="A cylinder has radius 3 and height 7. A sphere has the same volume. Find the sphere's radius.")),
]


@pytest.fixture(scope="module")
def corpus():
    return leakage.eval_corpus()


def test_reworded_evaluation_items_are_flagged_and_controls_are_not(corpus):
    flags = {f.prompt_id: f for f in leakage.find_leaks([*PLANTED.values(), *CONTROLS], corpus)}
    assert set(flags) == set(PLANTED)
    assert flags["planted/he59"].item in ("HumanEval/59", "Mbpp/32")
    assert flags["planted/mbpp123"].item == "Mbpp/123"
    assert flags["planted/math158"].item == "math500/158"


def test_without_the_planted_rewording_nothing_is_flagged(corpus):
    assert leakage.find_leaks(CONTROLS, corpus) == []


def test_training_and_the_copy_prior_skip_flagged_prompts(tmp_path):
    from vskip.distill.copyfit import load_answers
    from vskip.distill.rows import load_rows

    rows = [{"prompt": [5, 6], "completion": [7, 8, 9], "finished": True} for _ in range(3)]
    meta = {"prompt_ids": ["a", "b", "c"], "sources": ["codeio"] * 3}
    gen.write_shard(tmp_path / gen.shard_name(0), rows, meta)
    assert load_rows(tmp_path).prompt_ids == ["a", "b", "c"]
    (tmp_path / leakage.LEAKAGE_FILE).write_text(json.dumps({"flagged": [{"prompt_id": "b"}]}))
    assert load_rows(tmp_path).prompt_ids == ["a", "c"]
    assert len(load_answers(tmp_path, [gen.shard_name(0)])) == 2
    (tmp_path / leakage.LEAKAGE_FILE).write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a leakage list"):
        load_rows(tmp_path)


def test_the_committed_list_matches_the_rules():
    """datasets/distill/leakage.json is what the rules flag today (it is made by a command, not
    by hand), and it names the reworded HumanEval/59 of the CodeI/O prompts."""
    path = Path(__file__).parents[1] / "datasets" / "distill" / leakage.LEAKAGE_FILE
    data = json.loads(path.read_text())
    assert data["rules"] == {"copy_share": leakage.COPY_SHARE, "code_cosine": leakage.CODE_COSINE,
                             "name_cosine": leakage.NAME_COSINE, "math_cosine": leakage.MATH_COSINE}
    ids = {f["prompt_id"] for f in data["flagged"]}
    assert "codeio/02717" in ids and data["flagged_count"] == len(ids)
    assert np.isclose(sum(data["by_rule"].values()), len(ids))


def test_the_command_writes_the_list_of_a_data_directory(tmp_path, capsys):
    """``vskip flag-leakage`` flags the data directory's own prompts and writes leakage.json there;
    a directory that does not exist is refused in one line."""
    from vskip.cli import main
    from vskip.distill.prompts import write_prompts
    from vskip.distill.shards import PROMPTS_FILE

    write_prompts([*PLANTED.values(), *CONTROLS], tmp_path / PROMPTS_FILE)
    assert main(["flag-leakage", "--data", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / leakage.LEAKAGE_FILE).read_text())
    assert {f["prompt_id"] for f in rec["flagged"]} == set(PLANTED) and rec["prompts"] == len(PLANTED) + len(CONTROLS)
    assert rec["command"].startswith("vskip flag-leakage --data")
    assert main(["flag-leakage", "--data", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err
