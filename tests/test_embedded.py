"""Tests on the real embedded pair (SmolLM2-135M-Instruct and its drafter). Marked ``model``;
they run in CI too, on a few prompts with short outputs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vskip.engine.decode import DecodeConfig, decode
from vskip.engine.policy import PolicyConfig

from fakes import Oracle  # noqa: E402

pytestmark = pytest.mark.model
THREADS = os.environ.get("VSKIP_TEST_THREADS", "1")


@pytest.fixture(scope="module")
def pair():
    from vskip.engine.models.load import load_pair
    from vskip.engine.runtime import resolve_runtime

    return load_pair(resolve_runtime("cpu", "float32"))


@pytest.fixture(scope="module")
def prompts(pair):
    from vskip.bench import tasks
    from vskip.engine.prompting import encode_chat

    return [encode_chat(pair.tokenizer, tasks.user_prompt(p)) for p in tasks.load_task("humaneval", ids=["HumanEval/0", "HumanEval/2"])]


def test_strict_is_lossless_on_the_embedded_pair(pair, prompts):
    cfg = DecodeConfig(gamma=16, max_new_tokens=40)
    for ids in prompts:
        pair.verifier.use_cache = True
        ar = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), cfg)
        for cache in (True, False):
            pair.verifier.use_cache = cache
            strict = decode(ids, pair.drafter, pair.verifier, PolicyConfig(name="strict"), cfg)
            assert strict.tokens == ar.tokens, f"cache={cache}"
            oracle = decode(ids, Oracle(len(ids), ar.tokens, 0.2), pair.verifier, PolicyConfig(name="strict"), cfg)
            assert oracle.tokens == ar.tokens, f"cache={cache}"
            assert max(r.L for r in oracle.rounds) >= 8  # long acceptances were exercised
        pair.verifier.use_cache = True
        skip = decode(ids, Oracle(len(ids), ar.tokens, 0.0), pair.verifier,
                      PolicyConfig(name="raw", k_min=1, s_max=24), cfg)
        assert skip.skipped_rounds > 0 and skip.tokens == ar.tokens


@pytest.mark.parametrize("drafter_dtype", ["bfloat16", "float32"])
def test_strict_is_lossless_with_any_drafter_dtype_steps_and_block_length(drafter_dtype, prompts):
    """Only the verifier's argmax decides what Strict SDD commits: a drafter in another dtype, with
    one or two reveal steps, and a block length chosen per round all give the verifier's output."""
    import copy

    from vskip.engine.models.load import load_pair
    from vskip.engine.runtime import resolve_runtime

    p = load_pair(resolve_runtime("cpu", "float32", drafter_dtype=drafter_dtype), steps=1)
    assert str(p.drafter._W.dtype) == f"torch.{drafter_dtype}"
    two = copy.copy(p.drafter)
    two.steps = 2
    for ids in prompts:
        ar = decode(ids, None, p.verifier, PolicyConfig(name="ar"), DecodeConfig(max_new_tokens=48))
        for drafter in (p.drafter, two):
            for cfg in (DecodeConfig(gamma=8, max_new_tokens=48), DecodeConfig(gamma=4, gamma_max=16, min_match=3,
                                                                                max_new_tokens=48)):
                res = decode(ids, drafter, p.verifier, PolicyConfig(name="strict"), cfg)
                assert res.tokens == ar.tokens, (drafter.steps, cfg)
                assert res.verifier_calls < len(ar.tokens)


def test_drafter_proposes_valid_tokens_with_features(pair, prompts):
    b = pair.drafter.propose(prompts[0], 16, features=True)
    assert b.tokens.shape == (16,) and np.all(b.tokens < len(pair.tokenizer))
    assert not set(b.tokens.tolist()) & pair.verifier.special_ids
    assert np.all((b.confidence > 0) & (b.confidence <= 1))
    assert b.features.shape == (16, 14) and tuple(b.hidden.shape) == (16, 576)


def test_run_writes_the_four_files(tmp_path):
    out = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "vskip", "run", "--task", "humaneval", "--limit", "2", "--policy", "raw",
         "--max-new-tokens", "24", "--out", str(out), "--quiet", "--threads", THREADS],
        capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, res.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["run"]["policy"]["name"] == "raw" and "torch" in cfg["versions"]
    samples = [json.loads(l) for l in (out / "samples.jsonl").read_text().splitlines()]
    rounds = [json.loads(l) for l in (out / "rounds.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    for s in samples:
        for k in ("task_id", "completion", "passed", "generated_tokens", "decode_seconds", "verifier_calls",
                  "draft_blocks", "skipped_rounds"):
            assert k in s, k
        assert isinstance(s["passed"], bool)
        mine = [r for r in rounds if r["task_id"] == s["task_id"]]
        assert sum(r["committed"] for r in mine) == s["generated_tokens"]
        assert sum(r["verified"] for r in mine) == s["verifier_calls"]
        assert sum(not r["verified"] for r in mine) == s["skipped_rounds"]
    for r in rounds:
        for k in ("task_id", "round", "verified", "K", "L", "committed"):
            assert k in r, k
    for k in ("task", "policy", "n_prompts", "pass_at_1", "generated_tokens", "decode_seconds", "tokens_per_s",
              "verifier_calls", "draft_blocks", "calls_per_token", "blocks_per_token", "strict_token",
              "full_prefix", "skipped_rounds"):
        assert k in summary, k
    assert summary["n_prompts"] == 2
    assert summary["generated_tokens"] == sum(r["committed"] for r in rounds)
    assert summary["verifier_calls"] == sum(r["verified"] for r in rounds)
    assert summary["skipped_rounds"] == sum(not r["verified"] for r in rounds)
    assert summary["draft_blocks"] == len(rounds)
    # the printed line's speed names the machine it was measured on, as the run recorded it
    from vskip.engine.runtime import machine_name

    printed = json.loads(res.stdout.strip().splitlines()[-1])
    assert printed["tokens_per_s"] == summary["tokens_per_s"]
    assert printed["machines"] == [machine_name(m) for m in summary["machines"]] and printed["machines"]
    # rerunning the same command resumes: nothing is decoded again
    again = subprocess.run(
        [sys.executable, "-m", "vskip", "run", "--task", "humaneval", "--limit", "2", "--policy", "raw",
         "--max-new-tokens", "24", "--out", str(out), "--quiet", "--threads", THREADS],
        capture_output=True, text=True, timeout=600,
    )
    assert again.returncode == 0, again.stderr
    assert (out / "rounds.jsonl").read_text().count("\n") == len(rounds)


def test_a_drafter_whose_vocabulary_does_not_fit_is_refused(tmp_path):
    import torch

    from vskip.engine.models.backbone import BackboneConfig
    from vskip.engine.models.diffusion_lm import DiffusionLM, DrafterSpec
    from vskip.engine.models.drafter_io import save_drafter

    spec = DrafterSpec(backbone=BackboneConfig(96, 32, 64, 1, 4, 2), mask_token_id=None, head="tied")
    save_drafter(DiffusionLM(spec), tmp_path / "small", dtype=torch.float32)
    res = subprocess.run([sys.executable, "-m", "vskip", "generate", "hi", "--drafter", str(tmp_path / "small"),
                          "--threads", THREADS], capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("vskip: error: the drafter's vocabulary")


def test_the_shipped_drafter_loads_matches_its_manifest_and_is_trained(pair):
    from vskip.engine.models.embedded import EMBEDDED_DRAFTER, embedded_drafter_dir, embedded_verifier_dir, file_sha256

    d = embedded_drafter_dir()
    manifest = json.loads((d / "manifest.json").read_text())
    weights = d / manifest["weights"]["file"]
    assert weights.stat().st_size == manifest["weights"]["bytes"] <= 50 * 2**20
    assert file_sha256(weights) == manifest["weights"]["sha256"]
    vmark = json.loads((embedded_verifier_dir() / "vskip.json").read_text())
    assert manifest["verifier"]["verifier_source_sha256"] == vmark["sha256"]
    assert pair.identity["drafter"] == EMBEDDED_DRAFTER
    # Trained, not the untrained fallback: its held-out acceptance was measured and is above zero.
    assert manifest["steps"] > 0 and manifest["holdout"]["mean_L"] > 0.2
    assert manifest["data"]["files"] and all(len(f["sha256"]) == 64 for f in manifest["data"]["files"])


def test_the_shipped_copy_prior_is_on_by_default_recorded_and_copies(pair, prompts):
    from vskip.engine.models.copy import COPY_FILE
    from vskip.engine.models.embedded import embedded_drafter_dir, file_sha256

    d = embedded_drafter_dir()
    manifest = json.loads((d / "manifest.json").read_text())
    sha = file_sha256(d / COPY_FILE)
    assert manifest["copy_prior"]["sha256"] == sha == pair.identity["copy_prior"]
    prior = pair.drafter.copy
    assert prior is not None
    # fitted on answers the network never trained on, and evaluated on others again
    if "holdout_of" in prior.meta:  # the rows training held out: recompute the split from the committed data
        from vskip.distill.copyfit import rows_sha256
        from vskip.distill.rows import load_rows, split

        how = prior.meta["holdout_of"]
        assert (how["holdout"], how["seed"]) == (manifest["train"]["holdout"], manifest["train"]["seed"])
        data = Path(__file__).parents[1] / "datasets" / "distill"
        assert {f["sha256"] for f in manifest["data"]["files"]} <= {file_sha256(f) for f in data.glob("shard_*")}
        _, ho = split(load_rows(data), how["holdout"], how["seed"])
        rows = list(zip(ho.rows, ho.prompt_lens))
        half = len(rows) // 2
        assert half >= 100 and prior.meta["fit_rows"] == half and prior.meta["eval_rows"] == len(rows) - half
        assert rows_sha256(rows[:half]) == how["fit_rows_sha256"] and rows_sha256(rows[half:]) == how["eval_rows_sha256"]
    else:  # whole shards, none of them trained on
        trained = {f["sha256"] for f in manifest["data"]["files"]}
        fit = {f["sha256"] for f in prior.meta["fit_shards"]}
        held = {f["sha256"] for f in prior.meta["eval_shards"]}
        assert fit and held and not (fit & trained) and not (held & trained) and not (fit & held)
    assert prior.meta["drafter_weights_sha256"]["drafter.safetensors"] == manifest["weights"]["sha256"]
    ho = prior.meta["heldout"]
    assert ho["nll_mixture"] < ho["nll_network"]
    # a long match is copied: a stretch of the prompt, started again, is continued from it
    ids = list(prompts[0])
    start = len(ids) // 2
    seq = ids + ids[start:start + 8]
    assert sum(ids[i:i + 8] == ids[start:start + 8] for i in range(len(ids))) == 1
    from vskip.engine.models.copy import copy_hint

    hint, length = copy_hint(seq, 4)
    assert length >= 8 and hint.tolist() == ids[start + 8:start + 12]
    b = pair.drafter.propose(seq, 4)
    assert b.tokens.tolist() == hint.tolist()
    assert np.all(b.confidence >= prior.weights(length, 4) - 1e-6)  # at least the hint's own mass
