"""A corpus of bad inputs across every command: each ends in one line on stderr that names the
problem (exit 2 for bad input), never a traceback, and none of them loads a model."""

from __future__ import annotations

import json
import os

import pytest

from vskip import cli

OUT = "{tmp}/out"


def _files(tmp):
    """Damaged and misplaced files the cases point at."""
    (tmp / "afile").write_text("not a directory")
    (tmp / "empty").mkdir()
    (tmp / "bad.json").write_text("{\n")
    (tmp / "list.jsonl").write_text("[1, 2]\n")
    (tmp / "no_id.jsonl").write_text(json.dumps({"completion": "x"}) + "\n")
    (tmp / "not_utf8.jsonl").write_bytes(b"\xff\xfe\xfa\n")
    (tmp / "prior.json").write_text('{"lam": [[2.0]]}')
    (tmp / "run").mkdir()
    (tmp / "run" / "config.json").write_text("{")
    (tmp / "run" / "samples.jsonl").write_text("")
    os.mkfifo(tmp / "fifo")
    (tmp / "fifo_dir").mkdir()
    os.mkfifo(tmp / "fifo_dir" / "drafter.json")
    (tmp / "deep.jsonl").write_text("[" * 100000 + "]" * 100000 + "\n")
    row = {"task_id": "HumanEval/0", "config": "ar", "repeat": 0, "seconds": 1.0, "tokens": 5, "calls": 5}
    for name, change in [("cmp_zero", {"seconds": 0}), ("cmp_negative", {"seconds": -2.0}),
                         ("cmp_calls", {"calls": -1}), ("cmp_nan", {"seconds": float("nan")})]:
        (tmp / name).mkdir()
        (tmp / name / "shard-1-of-1.jsonl").write_text(json.dumps(row | change) + "\n")


# (argv, fragment the one error line must contain)
CASES = [
    ("generate caf\udce9", "not UTF-8 text"),
    ("score --task humaneval --samples {tmp}/deep.jsonl", "deep"),
    ("generate hi --max-memory cpu=1e999GiB", "--max-memory"),
    ("generate hi --max-memory cpu=1e30GiB", "larger than any device"),
    ("train-conditioned --data {tmp}/empty --features {tmp}/empty --out {tmp}/t --device cuda", "no CUDA device"),
    ("train-conditioned --data {tmp}/empty --features {tmp}/empty --out {tmp}/t --device tpu", "unknown device"),
    ("extract-features --data {tmp}/empty --out {tmp}/f --device cuda:3", "no CUDA device"),
    ("sweep --grid full --task humaneval --out {tmp}/s --executor ray --gpus-per-worker nan", "--gpus-per-worker"),
    ("sweep --grid full --task humaneval --out {tmp}/s --workers 100000000", "--workers"),
    # compare --summary over damaged rows
    ("compare --summary --out {tmp}/cmp_zero", "has seconds 0"),
    ("compare --summary --out {tmp}/cmp_negative", "has seconds -2.0"),
    ("compare --summary --out {tmp}/cmp_calls", "has calls -1"),
    ("compare --summary --out {tmp}/cmp_nan", "has seconds nan"),
    # sampling
    ("run --task humaneval --out {tmp}/o --temperature -1", "--temperature"),
    ("run --task humaneval --out {tmp}/o --temperature nan", "--temperature"),
    ("run --task humaneval --out {tmp}/o --temperature 0.6 --top-p 0", "--top-p must lie in (0, 1]"),
    ("run --task humaneval --out {tmp}/o --temperature 0.6 --top-p 1.5", "--top-p must lie in (0, 1]"),
    ("run --task humaneval --out {tmp}/o --top-p 0.9", "give them with --temperature > 0"),
    ("run --task humaneval --out {tmp}/o --temperature 0.6 --sample-top-k -2", "--sample-top-k"),
    ("run --task humaneval --out {tmp}/o --temperature 0.6 --seed 1.5", "--seed"),
    ("run --task humaneval --out {tmp}/o --temperature 0.6 --seed -3", "--seed"),
    ("run --task humaneval --out {tmp}/o --temperature 0.6 --policy lenience --lenience 0.5", "takes no --temperature"),
    ("generate hi --temperature 0.6 --policy topk --top-k 3", "takes no --temperature"),
    ("run --task humaneval --out {tmp}/o --speculative-sampling", "--speculative-sampling needs --temperature above 0"),
    ("generate hi --temperature 0.6 --speculative-sampling --steps 2", "drafts its block in one forward"),
    ("compare --task humaneval --limit 1 --temperature 0.6 --speculative-sampling --preset paper", "one forward"),
    ("sweep --grid table5 --task humaneval --out {tmp}/s --temperature 0.6", "takes no --temperature"),
    ("run --task humaneval --out {tmp}/o --samples-per-prompt 0", "--samples-per-prompt"),
    ("run --task humaneval --out {tmp}/o --samples-per-prompt 4", "needs --temperature > 0"),
    ("compare --task humaneval --configs ar,lenience+lenience=0.5 --temperature 0.6", "takes no --temperature"),
    # run: flags
    ("run --task nope --out {tmp}/o", "argument --task: invalid choice: 'nope'"),
    ("train-predictor --kind marginal --traces {tmp}/empty --out {tmp}/p --epochs 10000000000000000000000", "--epochs"),
    ("diagnose {tmp}/empty --out {tmp}/d --repetitions 10000000000000000000000", "--repetitions"),
    ("diagnose {tmp}/empty --out {tmp}/d --seed -1", "--seed"),
    ("calibrate-prefix {tmp}/empty --alpha 0.05 --step 1e-8", "--step"),
    ("report {tmp}/empty --out {tmp}/r --bootstrap 100000000000000000000000", "--bootstrap"),
    ("report {tmp}/empty --out {tmp}/r --seed -1", "--seed"),
    ("generate-data --out {tmp}/g --check -1", "--check"),
    ("generate-data --out {tmp}/g --limit -1", "--limit"),
    ("generate-data --out {tmp}/g --sources nope", "--sources"),
    ("score --task humaneval --samples {tmp}/fifo", "is not a regular file"),
    ("generate hi --copy-prior {tmp}/fifo", "is not a regular file"),
    ("run --task humaneval --out ''", "run directory is empty"),
    ("train-conditioned --data {tmp}/empty --features {tmp}/empty --out {tmp}/t", "holds no index.json"),
    ("train-conditioned --data {tmp}/nope --features {tmp}/empty --out {tmp}/t", "data directory"),
    ("train-conditioned --data {tmp}/empty --features {tmp}/empty --out {tmp}/t --lr nan", "--lr"),
    ("train-conditioned --data {tmp}/empty --features {tmp}/empty --out {tmp}/t --block-size 1", "--block-size"),
    ("train-conditioned --data {tmp}/empty --features {tmp}/empty --out {tmp}/t --block-size 1000000",
     "--block-size must lie in 2..513"),
    # a file where a directory is expected is named as one, not as missing
    ("train-conditioned --data {tmp}/afile --features {tmp}/empty --out {tmp}/t", "afile is a file, not a directory"),
    ("extract-features --data {tmp}/afile --out {tmp}/f", "data directory {tmp}/afile is a file, not a directory"),
    ("train-drafter --data {tmp}/afile --out {tmp}/t", "data directory {tmp}/afile is a file, not a directory"),
    ("fit-copy-prior --data {tmp}/empty --fit-shards a.npz --drafter {tmp}/afile", "afile is a file, not a directory"),
    ("train-predictor --kind marginal --traces {tmp}/afile --out {tmp}/p", "afile is a file, not a directory"),
    ("plan --drafter {tmp}/fifo_dir", "drafter.json is not a regular file"),
    ("train-conditioned --data {tmp}/empty --features {tmp}/empty --out {tmp}/t --until 25:99", "--until"),
    ("extract-features --data {tmp}/nope --out {tmp}/f", "data directory"),
    ("extract-features --data {tmp}/empty --out {tmp}/f --taps 0", "--taps"),
    ("extract-features --data {tmp}/empty --out {tmp}/f --layers a,b", "layer indices"),
    ("run --task humaneval --out {tmp}/o --preset nope", "invalid choice"),
    ("run --task humaneval --out {tmp}/o --limit 0", "--limit must be >= 1"),
    ("run --task humaneval --out {tmp}/o --limit -3", "--limit must be >= 1"),
    ("run --task humaneval --out {tmp}/o --ids ,", "--ids names no task id"),
    ("run --task humaneval --out {tmp}/o --ids ' , '", "--ids names no task id"),
    ("run --task humaneval --out {tmp}/o --gamma 0", "gamma must lie in 1..512"),
    ("run --task humaneval --out {tmp}/o --gamma -5", "gamma must lie in 1..512"),
    ("run --task humaneval --out {tmp}/o --gamma 100000", "gamma must lie in 1..512"),
    ("run --task humaneval --out {tmp}/o --gamma 8 --gamma-max 4", "gamma-max must be >= gamma"),
    ("run --task humaneval --out {tmp}/o --gamma-max 9999", "gamma-max must be at most 512"),
    ("run --task humaneval --out {tmp}/o --min-match 0 --gamma-max 16", "min-match must be >= 1"),
    ("run --task humaneval --out {tmp}/o --trim 1.5", "trim must lie in [0, 1]"),
    ("run --task humaneval --out {tmp}/o --trim -0.1", "trim must lie in [0, 1]"),
    ("run --task humaneval --out {tmp}/o --trim 0.5 --trace --policy strict", "traces need"),
    ("run --task humaneval --out {tmp}/o --drafts sometimes", "invalid choice: 'sometimes'"),
    ("run --task humaneval --out {tmp}/o --policy marginal --drafts payoff", "--drafts payoff chooses"),
    ("run --task humaneval --out {tmp}/o --max-new-tokens 0", "max-new-tokens must be >= 1"),
    ("run --task humaneval --out {tmp}/o --threads 0", "--threads must lie in 1.."),
    ("run --task humaneval --out {tmp}/o --threads -4", "--threads must lie in 1.."),
    ("run --task humaneval --out {tmp}/o --threads 4096", "--threads must lie in 1.."),
    ("run --task humaneval --out {tmp}/o --device tpu9", "unknown device 'tpu9'"),
    ("run --task humaneval --out {tmp}/o --device cuda", "no CUDA device"),
    ("run --task humaneval --out {tmp}/o --device cuda:3", "no CUDA device"),
    ("run --task humaneval --out {tmp}/o --device meta", "unsupported device 'meta'"),
    ("run --task humaneval --out {tmp}/afile", "is a file, not a directory"),
    ("run --task humaneval --out {tmp}/afile/sub", "cannot write in run directory"),
    ("run --task humaneval --out {tmp}/run --limit 1", "config.json is not valid JSON"),
    ("run --task humaneval --out {tmp}/o --ids HumanEval/99999", "HumanEval/99999"),
    ("run --task humaneval --out {tmp}/o --policy nope", "invalid choice: 'nope'"),
    ("run --task humaneval --out {tmp}/o --gamma x", "invalid int value: 'x'"),
    ("run --task humaneval --out {tmp}/o --lenience 0", "lenience"),
    ("run --task humaneval --out {tmp}/o --policy topk --top-k 0", "top-k must lie in 1..64"),
    ("run --task humaneval --out {tmp}/o --policy topk --top-k 65", "top-k must lie in 1..64"),
    ("run --task humaneval --out {tmp}/o --k-min -1", "k_min must be >= 0"),
    ("run --task humaneval --out {tmp}/o --s-max 0", "s_max"),
    ("run --task humaneval --out {tmp}/o --policy periodic --period 0", "period"),
    ("run --task humaneval --out {tmp}/o --policy raw --eta-b 1.5", "eta"),
    ("run --task humaneval --out {tmp}/o --policy raw --eta-c -0.5", "eta"),
    ("run --task humaneval --out {tmp}/o --policy marginal --eta-m 2", "eta"),
    ("run --task humaneval --out {tmp}/o --policy conditional --epsilon 2", "epsilon"),
    ("run --task humaneval --out {tmp}/o --dtype float64", "invalid choice: 'float64'"),
    ("run --task humaneval --out {tmp}/o --drafter-dtype int8", "invalid choice: 'int8'"),
    ("run --task humaneval --out {tmp}/o --reveal random", "invalid choice: 'random'"),
    ("run --task humaneval --out {tmp}/o --limit 1 --max-new-tokens 8190 --no-score", "exceeds the verifier's context"),
    ("compare --limit 1 --max-new-tokens 9000", "exceeds the verifier's context"),
    ("run --task humaneval", "the following arguments are required: --out"),
    ("run --out {tmp}/o", "the following arguments are required: --task"),
    ("run --task humaneval --out {tmp}/o --bogus", "unrecognized arguments: --bogus"),
    # generate
    ("generate ''", "the prompt is empty"),
    ("generate '   '", "the prompt is empty"),
    ("generate hi --gamma 0", "gamma must lie in 1..512"),
    ("generate hi --threads 0", "--threads must lie in 1.."),
    ("generate hi --device tpu9", "unknown device"),
    ("generate hi --max-new-tokens -1", "max-new-tokens must be >= 1"),
    ("generate hi --trim 2", "trim must lie in [0, 1]"),
    ("generate hi --gamma 64 --gamma-max 32", "gamma-max must be >= gamma"),
    ("generate", "the following arguments are required: prompt"),
    ("generate '" + "word " * 9000 + "'", "exceeds the verifier's context"),
    # compare
    ("compare --configs strict", "--configs must include ar"),
    ("compare --configs ar,nope", "nope"),
    ("compare --configs ar,strict+gamma=0", "gamma"),
    ("compare --configs ar,strict+speed=3", "speed"),
    ("compare --configs ar,strict+gamma", "gamma"),
    ("compare --shard 3/2", "--shard must be I/N"),
    ("compare --shard 0/2", "--shard must be I/N"),
    ("compare --shard x", "--shard must be I/N"),
    ("compare --shard 1/2/3", "--shard must be I/N"),
    ("compare --task nope", "argument --task: invalid choice: 'nope'"),
    ("compare --limit 0", "--limit must be >= 1"),
    ("compare --ids ,", "--ids names no task id"),
    ("compare --summary", "--summary needs --out DIR"),
    ("compare --summary --out {tmp}/missing", "--summary needs --out DIR"),
    ("compare --threads 0", "--threads must lie in 1.."),
    ("compare --device tpu9", "unknown device"),
    ("compare --gamma 0", "gamma must lie in 1..512"),
    # score
    ("score --task humaneval --samples {tmp}/missing.jsonl", "missing.jsonl"),
    ("score --task humaneval --samples {tmp}/list.jsonl", "list.jsonl line 1 is not a JSON object"),
    ("score --task humaneval --samples {tmp}/no_id.jsonl", "task_id"),
    ("score --task humaneval --samples {tmp}/not_utf8.jsonl", "not_utf8.jsonl"),
    ("score --task humaneval --samples {tmp}/empty", "empty"),
    ("score --task nope --samples {tmp}/no_id.jsonl", "nope"),
    ("score --task humaneval", "the following arguments are required: --samples"),
    ("score --task humaneval --samples {tmp}/no_id.jsonl --out {tmp}/empty", "is a directory"),
    ("score --task humaneval --samples {tmp}/no_id.jsonl --out {tmp}/afile/x.json", "is a file, not a directory"),
    # sweep
    ("sweep --task humaneval --grid nope --out {tmp}/s", "nope"),
    ("sweep --task nope --grid cpu-small --out {tmp}/s", "nope"),
    ("sweep --task humaneval --grid cpu-small --out {tmp}/s --workers 0", "workers"),
    ("sweep --task humaneval --grid cpu-small --out {tmp}/s --shards 0", "shards"),
    ("sweep --task humaneval --grid cpu-small --out {tmp}/s --limit 0", "limit"),
    ("sweep --task humaneval --grid cpu-small --out {tmp}/s --gamma 0", "gamma"),
    ("sweep --task humaneval --grid cpu-small --out {tmp}/afile", "afile"),
    ("sweep --task humaneval --grid cpu-small --out {tmp}/s --executor nope", "invalid choice: 'nope'"),
    ("sweep --task humaneval --grid cpu-small --out {tmp}/s --threads 0", "threads"),
    ("sweep --task humaneval --grid cpu-small --out {tmp}/s --ids ,", "--ids names no task id"),
    # report
    ("report {tmp}/missing --out {tmp}/r", "missing"),
    ("report {tmp}/empty --out {tmp}/r", "empty"),
    ("report {tmp}/run --out {tmp}/r", "config.json"),
    ("report {tmp}/empty --out {tmp}/r --bootstrap 0", "bootstrap"),
    # train-drafter
    ("train-drafter --data {tmp}/missing --out {tmp}/t", "missing"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t", "empty"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --gamma 0", "gamma"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --num-layers 0", "num-layers"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --train-steps 0", "steps"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --lr -1", "lr"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --lr inf", "--lr must be a finite number"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --position-decay nan", "--position-decay must be a finite"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --num-layers 999", "the verifier has 30 layers"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --layers 0,45", "the verifier has 30 layers"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --full-mask-share 2", "full-mask-share"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --layers 0,0", "layers"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --early-share 2", "early-share"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --early-tokens 0", "early-tokens"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --replay-answers -1", "replay-answers"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --init-from {tmp}/missing", "init-from"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --layers a,b", "layers"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --threads 0", "threads"),
    ("train-drafter --data {tmp}/empty --out {tmp}/afile", "afile"),
    ("train-drafter --data {tmp}/empty --out {tmp}/t --verifier {tmp}/missing", "missing"),
    ("train-drafter --out {tmp}/t", "the following arguments are required: --data"),
    # fit-copy-prior
    ("fit-copy-prior --data {tmp}/missing --fit-shards a.npz", "missing"),
    ("fit-copy-prior --data {tmp}/empty --fit-shards a.npz", "a.npz"),
    ("fit-copy-prior --data {tmp}/empty --fit-shards a.npz --gamma 0", "gamma"),
    ("fit-copy-prior --data {tmp}/empty --fit-shards a.npz --per-row 0", "per-row"),
    ("fit-copy-prior --data {tmp}/empty --fit-shards ,", "fit-shards"),
    ("fit-copy-prior --data {tmp}/empty --fit-shards a.npz --drafter {tmp}/missing", "missing"),
    ("fit-copy-prior --data {tmp}/empty", "either --fit-shards"),
    ("fit-copy-prior --fit-shards a.npz --holdout-of {tmp}/empty", "either --fit-shards"),
    ("fit-copy-prior --holdout-of {tmp}/missing", "missing"),
    ("fit-copy-prior --holdout-of {tmp}/empty --eval-shards a.npz", "drop --eval-shards"),
    # train-predictor
    ("train-predictor --kind marginal --traces {tmp}/missing --out {tmp}/p", "missing"),
    ("train-predictor --kind marginal --traces {tmp}/empty --out {tmp}/p", "empty"),
    ("train-predictor --kind nope --traces {tmp}/empty --out {tmp}/p", "invalid choice: 'nope'"),
    ("train-predictor --kind marginal --traces {tmp}/empty --out {tmp}/p --epochs 0", "epochs"),
    ("train-predictor --kind marginal --traces {tmp}/empty --out {tmp}/p --batch-size 0", "batch"),
    ("train-predictor --kind marginal --traces {tmp}/empty --out {tmp}/p --lr 0", "lr"),
    ("train-predictor --kind marginal --traces {tmp}/empty --out {tmp}/afile", "afile"),
    # diagnose
    ("diagnose {tmp}/missing --out {tmp}/d", "missing"),
    ("diagnose {tmp}/empty --out {tmp}/d", "empty"),
    ("diagnose {tmp}/empty --out {tmp}/d --repetitions 0", "repetitions"),
    ("diagnose {tmp}/empty --out {tmp}/d --predictors {tmp}/missing", "missing"),
    # the command itself
    ("", "the following arguments are required: command"),
    ("nope", "invalid choice: 'nope'"),
]


@pytest.mark.parametrize("argv,fragment", CASES, ids=[c[0][:60] for c in CASES])
@pytest.mark.filterwarnings("ignore")
def test_bad_input_is_one_line_naming_the_problem(argv, fragment, tmp_path, capsys, monkeypatch):
    import shlex

    import vskip.engine.models.load as load

    def no_models(*a, **k):  # every case must fail before a model loads
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(load, "load_pair", no_models)
    _files(tmp_path)
    args = shlex.split(argv.format(tmp=tmp_path))
    try:
        rc = cli.main(args)
    except SystemExit as e:  # argparse
        rc = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [l for l in err.splitlines() if l.startswith("vskip:")]
    assert lines and lines[0].startswith("vskip: error: "), err
    assert rc == 2, (rc, err)
    assert fragment.format(tmp=tmp_path).lower() in lines[0].lower(), (fragment, lines[0])
