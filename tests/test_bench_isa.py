"""benchmarks/isa_same_tokens.py's verdict and benchmarks/bench_isa.py's refusals, on files made here."""

import gzip
import json

import pytest
from scripts import load_script


def _run(path, rows, gz=False):
    path.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (path / "shard-1-of-1.jsonl.gz").write_bytes(gzip.compress(text.encode())) if gz \
        else (path / "shard-1-of-1.jsonl").write_text(text)


def _row(task, config, tokens, repeat=0):
    return {"task_id": task, "config": config, "repeat": repeat, "digest": str(hash(tuple(tokens))), "tokens": tokens}


def test_the_verdict_counts_what_differs_between_variants_and_against_a_reference(tmp_path):
    mod = load_script("isa_same_tokens")
    same = [_row("T/0", "ar", [1, 2, 3]), _row("T/0", "strict", [1, 2, 3]), _row("T/1", "ar", [4, 5]),
            _row("T/1", "strict", [4, 5])]
    _run(tmp_path / "t-avx2", same)
    _run(tmp_path / "t-portable", same[:3] + [_row("T/1", "strict", [4, 6]), _row("T/1", "strict", [9], repeat=1)],
         gz=True)
    _run(tmp_path / "ref", [_row("T/0", "ar", [1, 2, 3, 7]), _row("T/1", "ar", [4, 5, 8])])
    got = mod.verdict(tmp_path, ["t"], ["avx2", "portable"], {"t": str(tmp_path / "ref")}, max_new=3)
    assert got["compared"] == 4 and got["equal_across_variants"] == 3
    assert [(d["task_id"], d["config"]) for d in got["differing"]] == [("T/1", "strict")]
    assert got["by_variant"]["avx2"]["strict_equals_ar"] == 2 and got["by_variant"]["portable"]["strict_equals_ar"] == 1
    # T/0 stopped at its budget on the reference's text; T/1 stopped early where the reference went on
    assert got["against_reference"]["t"]["avx2"] == {"prompts": 2, "same": 1}


def test_the_scripts_refuse_a_variant_this_cpu_cannot_run(capsys, monkeypatch):
    from pathlib import Path

    from vskip.engine.models.native.build import machine_arch

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))  # their sibling imports
    other = "neon" if machine_arch() == "x86_64" else "avx2"
    for name in ("bench_isa", "isa_same_tokens"):
        with pytest.raises(SystemExit) as e:
            load_script(name).main(["--out", "unused", "--variants", other])
        assert e.value.code == 2 and f"the {other} variant runs on" in capsys.readouterr().err
