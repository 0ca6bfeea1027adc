"""Drafter training: the packed training layout computes what inference computes, training lowers
the loss, and a killed run resumes to the same state."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_models import tiny_llama

from vskip.distill.config import TrainConfig
from vskip.distill.rows import Data
from vskip.distill.train import load_state, make_batch, save_state, trainable
from vskip.engine.models.drafter import DiffusionDrafter
from vskip.engine.models.drafter_io import drafter_from_verifier


@pytest.fixture()
def verifier_dir(tmp_path):
    tiny_llama(0).save_pretrained(tmp_path / "v", safe_serialization=True)
    return tmp_path / "v"


def _data(n=6, seed=0):
    rng = np.random.default_rng(seed)
    rows = [rng.integers(3, 90, int(rng.integers(30, 60))).astype(np.int64) for _ in range(n)]
    return Data(rows, [10] * n, [f"p{i}" for i in range(n)])


@pytest.mark.parametrize("copy_input", [False, True])
def test_packed_blocks_match_inference(verifier_dir, copy_input):
    """Each packed query block sees exactly what the drafter sees at inference: the causally
    cached context and [x_{b-1}, masks] at positions b-1 .. b-1+gamma, and the same copy hints."""
    torch.manual_seed(0)
    model = drafter_from_verifier(verifier_dir, num_layers=2, copy_input=copy_input).eval()
    with torch.no_grad():
        model.mask_embedding.normal_()
        if copy_input:
            model.hint_proj.weight.normal_()
            model.hint_length.normal_()
    g, nb = 6, 3
    # a small alphabet: suffixes recur, so most blocks carry a hint
    data = _data(2) if not copy_input else Data([r % 7 + 3 for r in _data(2).rows], [10, 10], ["p0", "p1"])
    cfg = TrainConfig(gamma=g, blocks_per_seq=nb, batch_seqs=1, full_mask_share=1.0, copy_input=copy_input)
    drafter = DiffusionDrafter(model, steps=1)
    checked = hinted = 0
    for seed in (3, 4):  # one sequence per batch: no padding, so the query blocks are the last rows
        ids, pos, mask, tp, tt, _, hint = make_batch(data, np.random.default_rng(seed), cfg, model.mask_id,
                                                     torch.arange(96))
        assert (hint is not None) == copy_input
        with torch.no_grad():
            h, _ = model(ids, pos, None, mask, hint)
        b = 0
        C = ids.shape[1] - nb * (g + 1)
        for k in range(nb):
            r0 = C + k * (g + 1)
            start = int(pos[b, r0]) + 1  # the block's first target position
            row = next(rw for rw in data.rows if len(rw) >= start and rw[start - 1] == ids[b, r0]
                       and np.array_equal(rw[:C], ids[b, :C].numpy()))
            drafter.reset()
            x, P, q0, missing = drafter.block_query(row[:start].tolist(), g)
            assert (P, q0, len(missing)) == (1, start - 1, start - 1)
            _, code = drafter._hint_input(row[:start].tolist(), x, P, g)
            if copy_input:
                assert torch.equal(code[0], hint[b, r0 : r0 + g + 1])
                hinted += int((code >= 0).any())
            with torch.no_grad():
                query = SimpleNamespace(x=x, start=q0, missing=missing, code=code)
                want = drafter.body.hidden([query], [0], first=True)[0]
            got = h[b, r0 : r0 + g + 1]
            assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
            checked += 1
    assert checked == 2 * nb
    assert hinted >= nb or not copy_input
    # targets: hidden at query index j predicts the token at start + j
    assert tt.shape[0] == tp.shape[0] > 0


def test_training_lowers_loss_and_resumes(verifier_dir, tmp_path):

    cfg = TrainConfig(num_layers=1, gamma=4, blocks_per_seq=4, batch_seqs=2, steps=4, lr=3e-3, warmup=1,
                      holdout=0, dtype="float32", checkpoint_every=2, eval_every=1000)
    torch.manual_seed(0)
    model = drafter_from_verifier(verifier_dir, num_layers=1, copy_input=True)
    opt = torch.optim.AdamW(trainable(model).values(), lr=cfg.lr)
    data = _data(4)
    V = model.spec.backbone.vocab_size
    head_index = torch.arange(V)
    rng = np.random.default_rng(0)
    batch = make_batch(data, rng, cfg, model.mask_id, head_index)

    def loss_of(m):
        ids, pos, mask, tp, tt, _, hint = batch
        h, _ = m(ids, pos, None, mask, hint)
        return torch.nn.functional.cross_entropy(h[tp[:, 0], tp[:, 1]] @ m.head_weight().T, tt)

    first = float(loss_of(model).detach())
    for _ in range(15):
        opt.zero_grad()
        loss_of(model).backward()
        opt.step()
    assert float(loss_of(model).detach()) < first - 0.5
    save_state(tmp_path, model, opt, 15, cfg, [])
    fresh = drafter_from_verifier(verifier_dir, num_layers=1, copy_input=True)
    opt2 = torch.optim.AdamW(trainable(fresh).values(), lr=cfg.lr)
    step, _ = load_state(tmp_path, fresh, opt2)
    assert step == 15
    for (n, a), b in zip(trainable(model).items(), trainable(fresh).values()):
        assert torch.equal(a, b), n
    # one more identical step on both gives identical parameters
    for m, o in ((model, opt), (fresh, opt2)):
        o.zero_grad()
        loss_of(m).backward()
        o.step()
    for a, b in zip(trainable(model).values(), trainable(fresh).values()):
        assert torch.allclose(a, b, atol=1e-6)


def test_manifest_records_verifier_data_and_weights(verifier_dir, tmp_path):
    import json

    from vskip.distill.shards import data_fingerprint
    from vskip.distill.train import write_manifest
    from vskip.engine.models.drafter_io import save_drafter
    from vskip.engine.models.embedded import file_sha256

    model = drafter_from_verifier(verifier_dir, num_layers=1)
    ddir = save_drafter(model, tmp_path / "run" / "drafter", base_dir=verifier_dir,
                        meta={"steps": 7, "holdout": {"mean_L": 0.4}, "rows": 5, "head_size": 96})
    data = tmp_path / "data"
    data.mkdir()
    for i, payload in enumerate((b"a", b"bb")):
        (data / f"shard_{i:05d}.safetensors").write_bytes(payload)
    (data / "index.json").write_text(json.dumps({"prompts_sha256": "p" * 64, "max_new_tokens": 9}))
    # Recorded at training start: only the first shard existed then.
    (tmp_path / "run" / "config.json").write_text(json.dumps(
        {"data_files": data_fingerprint(data, ["shard_00000.safetensors"]), "rows": 5, "holdout_rows": 1}))
    m = write_manifest(ddir, tmp_path / "run", data, verifier_dir)
    assert json.loads((ddir / "manifest.json").read_text()) == m
    assert [f["file"] for f in m["data"]["files"]] == ["shard_00000.safetensors"]
    assert m["data"]["files"][0]["sha256"] == file_sha256(data / "shard_00000.safetensors")
    assert m["verifier"]["verifier_sha256"] == file_sha256(verifier_dir / "model.safetensors")
    assert m["weights"]["sha256"] == file_sha256(ddir / "drafter.safetensors")
    assert m["steps"] == 7 and m["holdout"]["mean_L"] == 0.4 and m["layout"]["backbone"]["num_layers"] == 1
    # Without a record, every shard of the data directory now.
    (tmp_path / "run" / "config.json").unlink()
    m = write_manifest(ddir, tmp_path / "run", data, verifier_dir)
    assert [f["file"] for f in m["data"]["files"]] == ["shard_00000.safetensors", "shard_00001.safetensors"]


def test_a_drafter_from_chosen_verifier_layers_round_trips(verifier_dir, tmp_path):
    from vskip.engine.models.backbone import read_safetensors_dir
    from vskip.engine.models.drafter_io import load_drafter_model, save_drafter

    model = drafter_from_verifier(verifier_dir, layers=[1, 0])
    assert model.spec.base_layers == (1, 0) and model.spec.backbone.num_layers == 2
    src = read_safetensors_dir(verifier_dir, lambda k: ".layers." in k)
    for i, j in enumerate((1, 0)):
        w = model.backbone.layers[i].state_dict()
        assert any(torch.equal(v, src[f"model.layers.{j}.{k}"]) for k, v in w.items())
        assert all(torch.equal(v, src[f"model.layers.{j}.{k}"]) for k, v in w.items() if f"model.layers.{j}.{k}" in src)
    with torch.no_grad():
        model.backbone.layers[1].mlp.down_proj.weight.add_(1.0)  # trained: one tensor now differs
    d = save_drafter(model, tmp_path / "d", base_dir=verifier_dir)
    back = load_drafter_model(d, base_dir=verifier_dir)
    assert back.spec.base_layers == (1, 0)
    for k, v in model.state_dict().items():
        assert torch.allclose(back.state_dict()[k].float(), v.float(), atol=1e-2), k
    # The first layers in order are the default layout, not a selection.
    assert drafter_from_verifier(verifier_dir, layers=[0, 1]).spec.base_layers is None
    with pytest.raises(ValueError, match="distinct"):
        drafter_from_verifier(verifier_dir, layers=[0, 0])


def test_a_manifest_naming_another_verifier_warns(tmp_path, capsys):
    import json

    from vskip.engine.models.drafter_files import verify_drafter

    (tmp_path / "v").mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / "v" / "vskip.json").write_text(json.dumps({"sha256": "a" * 64}))
    for want, warns in (("a" * 64, False), ("b" * 64, True)):
        (tmp_path / "d" / "manifest.json").write_text(json.dumps({"verifier": {"verifier_source_sha256": want}}))
        verify_drafter(tmp_path / "d", tmp_path / "v")
        assert ("distilled from verifier bbbbbbbbbbbb" in capsys.readouterr().err) == warns


def test_block_hint_follows_the_inference_rule():
    from vskip.distill.train import _block_hint
    from vskip.engine.models.copy import copy_hint
    from vskip.engine.models.diffusion_lm import hint_code

    V = 96
    ctx = np.array([5, 6, 7, 8, 5, 6], dtype=np.int64)  # suffix [5, 6] recurs: hint 7, 8, 5, 6 ...
    tokens, length = copy_hint(ctx, 4)
    assert tokens.tolist() == [7, 8, 5, 6] and length == 2
    code = hint_code(tokens, length, V)
    target = np.array([7, 9, 5, 6])
    none = np.zeros(4, dtype=bool)
    assert _block_hint(ctx, target, none, 4, True, V).tolist() == [-1] + code.tolist()
    # a revealed token that breaks the hint (position 1) drops the hints after it, not before
    reveal = np.array([False, True, False, False])
    assert _block_hint(ctx, target, reveal, 4, True, V).tolist() == [-1, code[0], code[1], -1, -1]
    # a revealed token that agrees keeps them
    reveal = np.array([True, False, False, False])
    assert _block_hint(ctx, target, reveal, 4, True, V).tolist() == [-1] + code.tolist()
    assert _block_hint(ctx, target, none, 4, False, V).tolist() == [-1] * 5
    assert _block_hint(np.array([1, 2, 3]), target, none, 4, True, V).tolist() == [-1] * 5  # no match


def test_a_copy_input_drafter_round_trips_and_reads_its_hints(verifier_dir, tmp_path):
    from vskip.engine.models.drafter_io import load_drafter_model, save_drafter

    torch.manual_seed(0)
    model = drafter_from_verifier(verifier_dir, num_layers=1, copy_input=True).eval()
    seq = [5, 6, 7, 8, 9, 5, 6]  # the hint continues 7, 8, 9 ...
    plain = DiffusionDrafter(model, steps=1).first_step(seq, 4)
    with torch.no_grad():  # an untrained hint input changes nothing; a trained one does
        assert torch.equal(plain, DiffusionDrafter(model, steps=1).first_step(seq, 4))
        model.hint_proj.weight.normal_()
        model.hint_length.normal_()
    hinted = DiffusionDrafter(model, steps=1).first_step(seq, 4)
    assert not torch.allclose(plain, hinted)
    assert DiffusionDrafter(model, steps=1).match_length(seq) == 2
    d = save_drafter(model, tmp_path / "d", base_dir=verifier_dir, dtype=torch.float32)
    back = load_drafter_model(d, base_dir=verifier_dir)
    assert back.spec.copy_input
    assert torch.allclose(DiffusionDrafter(back, steps=1).first_step(seq, 4), hinted, atol=1e-5)
    block = DiffusionDrafter(back, steps=2).propose(seq, 4)
    assert len(block.tokens) == 4


def test_outside_head_counts_answer_tokens_only():
    from vskip.distill.rows import outside_head

    d = Data([np.array([1, 2, 3, 4, 5]), np.array([7, 9])], [2, 1], ["a", "b"])
    assert outside_head(d, torch.tensor([1, 2, 3, 4])) == 0.5  # answers 3 4 5 | 9: 5 and 9 are outside
    assert outside_head(d, torch.tensor([3, 4, 5, 9])) == 0.0


@pytest.fixture()
def shipped(verifier_dir, tmp_path):
    """A drafter directory with weights, a copy prior and a manifest pinning both."""
    from vskip.distill.copyfit import write_copy_prior
    from vskip.distill.train import write_manifest
    from vskip.engine.models.copy import CopyPrior
    from vskip.engine.models.drafter_io import save_drafter

    model = drafter_from_verifier(verifier_dir, num_layers=1)
    with torch.no_grad():
        model.backbone.layers[0].mlp.down_proj.weight.add_(1.0)
    ddir = save_drafter(model, tmp_path / "d", base_dir=verifier_dir, meta={"steps": 1})
    (tmp_path / "data").mkdir()
    write_manifest(ddir, tmp_path, tmp_path / "data", verifier_dir)
    lam = [[0.5] * 10 for _ in range(7)]
    write_copy_prior(CopyPrior(lam=lam), ddir)
    return ddir


def test_a_drafter_matching_its_manifest_loads(shipped, verifier_dir):
    from vskip.engine.models.drafter_files import verify_drafter

    verify_drafter(shipped, verifier_dir, required=True)


@pytest.mark.parametrize("name", ["drafter.safetensors", "copy_prior.json"])
def test_a_damaged_drafter_file_refuses_naming_it(shipped, verifier_dir, name):
    from vskip.engine.models.drafter_files import verify_drafter
    from vskip.files import FileError

    f = shipped / name
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(FileError, match=f"{name} does not match the sha256"):
        verify_drafter(shipped, verifier_dir)


def test_a_missing_or_damaged_manifest_refuses_where_one_is_required(shipped, verifier_dir):
    from vskip.engine.models.drafter_files import verify_drafter
    from vskip.files import FileError

    m = shipped / "manifest.json"
    m.write_text("{")
    with pytest.raises(FileError, match="damaged; reinstall"):
        verify_drafter(shipped, verifier_dir, required=True)
    m.unlink()
    with pytest.raises(FileError, match="missing"):
        verify_drafter(shipped, verifier_dir, required=True)
    verify_drafter(shipped, verifier_dir)  # a user's drafter without a manifest is not checked


def test_a_shipped_drafter_without_the_copy_prior_its_manifest_names_refuses(shipped, verifier_dir):
    from vskip.engine.models.drafter_files import verify_drafter

    (shipped / "copy_prior.json").unlink()
    with pytest.raises(FileNotFoundError, match="copy_prior.json is missing"):
        verify_drafter(shipped, verifier_dir, required=True)
    verify_drafter(shipped, verifier_dir)  # a user's own drafter may leave its prior out


@pytest.mark.model
def test_a_missing_embedded_drafter_refuses_and_an_untrained_one_needs_its_name(tmp_path, monkeypatch, capsys):
    import vskip.engine.models.load as load
    from vskip.cli import main

    monkeypatch.setattr(load, "embedded_drafter_dir", lambda name=None: tmp_path / "gone")
    rc = main(["generate", "def f():", "--policy", "strict", "--max-new-tokens", "4", "--threads", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "drafter.json is missing" in err[0], err
    assert main(["generate", "def f():", "--policy", "strict", "--max-new-tokens", "4", "--threads", "1",
                 "--drafter", "untrained"]) == 0


def test_the_cached_verifier_is_sound_only_when_its_weights_match_their_hash(tmp_path):
    import json

    from vskip.engine.models.embedded import _cache_is_sound, file_sha256

    w = tmp_path / "model.safetensors"
    w.write_bytes(b"weights")
    assert not _cache_is_sound(tmp_path)  # no marker
    marker = tmp_path / "vskip.json"
    marker.write_text(json.dumps({"sha256": "s"}))
    assert not _cache_is_sound(tmp_path)  # a cache from before the weights were hashed: rebuilt
    marker.write_text(json.dumps({"sha256": "s", "model_sha256": file_sha256(w)}))
    assert _cache_is_sound(tmp_path)
    w.write_bytes(b"weightz")  # damaged (size equal, content not)
    assert not _cache_is_sound(tmp_path)
    marker.write_text("{")
    assert not _cache_is_sound(tmp_path)


def test_processes_that_start_together_build_the_cached_verifier_once(tmp_path, monkeypatch):
    """Two sweeps started side by side on a fresh machine once raced on one temporary directory and
    one of them died; the build now holds a lock, and the second finds the first one's cache."""
    import threading
    import time

    from vskip.engine.models import embedded
    from vskip.files import LOCK_FILE

    src = tmp_path / "src" / "model.gguf"
    src.parent.mkdir()
    src.write_bytes(b"gguf")
    builds = []

    def fake_convert(s, dst):
        assert not any(dst.iterdir()), "a build found another build's files in its directory"
        builds.append(dst)
        time.sleep(0.3)  # long enough for the other thread to arrive while this one builds
        (dst / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setenv("VSKIP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded, "gguf_path", lambda: src)
    monkeypatch.setattr(embedded, "_convert_gguf", fake_convert)
    got, errors = [], []

    def use():
        try:
            got.append(embedded.embedded_verifier_dir())
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=use) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(builds) == 1
    out = tmp_path / "cache" / embedded.EMBEDDED_VERIFIER
    assert got == [out] * 3 and embedded._cache_is_sound(out)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [LOCK_FILE, out.name]  # no build left behind


def _tiny_data(path, n=10, seed=0):
    from vskip.distill.generate import write_shard

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        prompt = rng.integers(3, 90, 8)
        answer = np.concatenate([rng.integers(3, 90, 20), prompt[:4], rng.integers(3, 90, 6), [2]])
        rows.append({"prompt": prompt, "completion": answer, "finished": True})
    path.mkdir(parents=True, exist_ok=True)
    write_shard(path / "shard_00000.npz", rows, {"prompt_ids": [f"p{i}" for i in range(n)], "sources": ["t"] * n})
    return path


def _final_weights(out):
    from safetensors.torch import load_file

    return load_file(str(out / "drafter" / "drafter.safetensors"))


def test_a_training_run_killed_anywhere_resumes_to_the_same_drafter(verifier_dir, tmp_path, monkeypatch):
    """Killed before any of its 10 steps, or inside a checkpoint (between writing the weights and
    the step they belong to), a run resumes to exactly the drafter of an uninterrupted run."""
    import vskip.distill.train as tr

    data = _tiny_data(tmp_path / "data")
    cfg = TrainConfig(num_layers=1, gamma=4, blocks_per_seq=2, batch_seqs=2, steps=10, warmup=1, lr=3e-3,
                      max_context=64, holdout=2, eval_every=1000, eval_blocks=4, checkpoint_every=3,
                      dtype="float32", threads=1)
    tr.train(data, tmp_path / "whole", verifier_dir, cfg, progress=False)
    want = _final_weights(tmp_path / "whole")
    points = [("make_batch", k) for k in range(1, 11)] + [("write_json", k) for k in (1, 2)]
    for fn, kill_at in points:
        real = getattr(tr, fn) if fn == "make_batch" else None
        calls = [0]
        if fn == "make_batch":
            def dies(*a, **k):
                calls[0] += 1
                if calls[0] == kill_at:
                    raise KeyboardInterrupt
                return real(*a, **k)

            monkeypatch.setattr(tr, "make_batch", dies)
        else:  # the checkpoint's second file: the weights are written, the step is not
            import vskip.files as files

            real = files.write_json

            def dies(path, *a, **k):
                if Path(path).name == tr.META_FILE:
                    calls[0] += 1
                    if calls[0] == kill_at:
                        raise KeyboardInterrupt
                return real(path, *a, **k)

            monkeypatch.setattr(files, "write_json", dies)
        out = tmp_path / f"killed-{fn}-{kill_at}"
        with pytest.raises(KeyboardInterrupt):
            tr.train(data, out, verifier_dir, cfg, progress=False)
        monkeypatch.undo()
        tr.train(data, out, verifier_dir, cfg, progress=False)
        got = _final_weights(out)
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), (fn, kill_at, k)


def test_the_curve_is_readable_while_a_run_goes_on(verifier_dir, tmp_path, monkeypatch):
    """Each held-out evaluation rewrites curve.csv, so a run killed halfway (or still going) shows
    its curve so far; `--export` writes it too."""
    import vskip.distill.train as tr

    data = _tiny_data(tmp_path / "data")
    cfg = TrainConfig(num_layers=1, gamma=4, blocks_per_seq=2, batch_seqs=2, steps=6, warmup=1, lr=3e-3,
                      max_context=64, holdout=2, eval_every=2, eval_blocks=4, checkpoint_every=2,
                      dtype="float32", threads=1)
    real, calls = tr.make_batch, [0]

    def dies(*a, **k):
        calls[0] += 1
        if calls[0] == 5:  # step 5, after the evaluations of steps 2 and 4
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(tr, "make_batch", dies)
    with pytest.raises(KeyboardInterrupt):
        tr.train(data, tmp_path / "t", verifier_dir, cfg, progress=False)
    monkeypatch.undo()
    steps = [line.split(",")[1] for line in (tmp_path / "t" / "curve.csv").read_text().splitlines()[1:]]
    assert steps == ["2", "4"] and (tmp_path / "t" / "curve.png").exists()
    (tmp_path / "t" / "curve.csv").unlink()
    tr.export(tmp_path / "t", verifier_dir)
    assert (tmp_path / "t" / "curve.csv").read_text().count("\n") == 3
    # the wall time of training rides in the log, summed over the resumed sessions, and the export records it
    import json

    tr.train(data, tmp_path / "t", verifier_dir, cfg, progress=False)
    tr.export(tmp_path / "t", verifier_dir)
    seconds = [e["seconds"] for e in tr.read_state_meta(tmp_path / "t")["log"]]
    assert len(seconds) == 6 and all(b > a for a, b in zip(seconds, seconds[1:]))
    meta = json.loads((tmp_path / "t" / "drafter" / "drafter.json").read_text())["meta"]
    assert meta["train_seconds"] == seconds[-1] > 0


def test_too_few_rows_refuse_before_training(verifier_dir, tmp_path):
    import vskip.distill.train as tr

    data = _tiny_data(tmp_path / "data", n=1)
    with pytest.raises(ValueError, match="too few"):
        tr.train(data, tmp_path / "t", verifier_dir, TrainConfig(num_layers=1, holdout=4, threads=1), progress=False)
    assert not (tmp_path / "t" / "train_state.safetensors").exists()


def test_early_share_draws_block_starts_from_the_first_answer_tokens():
    """--early-share 1 puts every block start inside the first --early-tokens answer tokens; the
    default (0) spreads them over the whole answer."""
    data = _data(6)
    P = 10

    def first_targets(cfg):
        starts = []
        for seed in range(12):  # one sequence per batch: no padding, so the query blocks are the last rows
            ids, pos, *_ = make_batch(data, np.random.default_rng(seed), cfg, 95, torch.arange(96))
            C = ids.shape[1] - cfg.blocks_per_seq * (cfg.gamma + 1)
            # a query block's first row sits at position b - 1 and holds x_{b-1}
            starts += [int(pos[0, C + k * (cfg.gamma + 1)]) + 1 for k in range(cfg.blocks_per_seq)]
        return np.asarray(starts)

    base = dict(gamma=4, blocks_per_seq=8, batch_seqs=1, max_context=64)
    early = first_targets(TrainConfig(**base, early_share=1.0, early_tokens=5))
    assert early.min() >= P and early.max() < P + 5
    spread = first_targets(TrainConfig(**base))
    assert spread.min() >= P and spread.max() >= P + 15
    with pytest.raises(ValueError, match="early-share"):
        TrainConfig(early_share=1.5)


def test_a_warm_start_takes_the_weights_and_refuses_another_split(verifier_dir, tmp_path):
    """--init-from starts from another run's latest weights and head with a fresh optimiser and
    schedule; its log continues the source's totals, config.json names the source, and a source
    with another held-out split (whose weights saw this run's held-out rows) is refused."""
    import json

    import vskip.distill.train as tr

    data = _tiny_data(tmp_path / "data")
    base = dict(num_layers=1, gamma=4, blocks_per_seq=2, batch_seqs=2, warmup=1, max_context=64, holdout=2,
                eval_every=2, eval_blocks=4, checkpoint_every=2, dtype="float32", threads=1, replay_answers=2,
                replay_tokens=8)
    tr.train(data, tmp_path / "a", verifier_dir, TrainConfig(**base, steps=4, lr=3e-3), progress=False)
    src = tr.read_state_meta(tmp_path / "a")
    # a learning rate too small to move the weights: what the warm-started run ends with is the source's
    tr.train(data, tmp_path / "b", verifier_dir,
             TrainConfig(**base, steps=2, lr=1e-12, init_from=str(tmp_path / "a"), early_share=0.5), progress=False)
    a, b = _final_weights(tmp_path / "a"), _final_weights(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.allclose(a[k].float(), b[k].float(), atol=1e-3) for k in a)
    log = tr.read_state_meta(tmp_path / "b")["log"]
    assert log[0]["init_from"] == str(tmp_path / "a") and log[0]["targets"] == src["log"][-1]["targets"]
    assert log[-1]["targets"] > log[0]["targets"] and log[-1]["seconds"] > log[0]["seconds"]
    assert "replay" in log[-1] and log[-1]["replay"]["answers"] == 2
    run = json.loads((tmp_path / "b" / "config.json").read_text())
    assert run["init_from"]["step"] == 4 and run["train"]["early_share"] == 0.5
    curve = (tmp_path / "b" / "curve.csv").read_text().splitlines()
    assert curve[0].endswith("decode_path_tokens_per_call") and len(curve) == 3  # the source's last point and step 2
    # a fresh start from the verifier ends elsewhere
    tr.train(data, tmp_path / "c", verifier_dir, TrainConfig(**base, steps=2, lr=1e-12), progress=False)
    c = _final_weights(tmp_path / "c")
    # (the shipped file holds only what differs from the verifier)
    assert c.keys() != a.keys() or any(not torch.allclose(a[k].float(), c[k].float(), atol=1e-3) for k in a)
    with pytest.raises(ValueError, match="holdout"):
        tr.train(data, tmp_path / "d", verifier_dir,
                 TrainConfig(**{**base, "holdout": 3}, steps=2, init_from=str(tmp_path / "a")), progress=False)
    with pytest.raises(FileNotFoundError, match="init-from"):
        tr.train(data, tmp_path / "e", verifier_dir, TrainConfig(**base, steps=2, init_from=str(tmp_path / "zz")),
                 progress=False)


def test_compare_training_pairs_runs_on_the_same_batches(verifier_dir, tmp_path, capsys):
    """benchmarks/compare_training.py compares two runs step for step only when their batches are
    the same (same data, seed and batch settings), and refuses otherwise."""
    from scripts import load_script

    import vskip.distill.train as tr

    mod = load_script("compare_training")
    data = _tiny_data(tmp_path / "data")
    base = dict(gamma=4, blocks_per_seq=2, batch_seqs=2, steps=4, warmup=1, lr=3e-3, max_context=64, holdout=2,
                eval_every=2, eval_blocks=4, checkpoint_every=2, dtype="float32", threads=1, replay_answers=0)
    tr.train(data, tmp_path / "one", verifier_dir, TrainConfig(num_layers=1, **base), progress=False)
    tr.train(data, tmp_path / "two", verifier_dir, TrainConfig(num_layers=2, **base), progress=False)
    tr.train(data, tmp_path / "seed", verifier_dir, TrainConfig(num_layers=2, **{**base, "seed": 1}), progress=False)
    assert mod.main([str(tmp_path / "one"), str(tmp_path / "two"), "--window", "2", "--out", str(tmp_path / "cmp")]) == 0
    res = json.loads((tmp_path / "cmp" / "results.json").read_text())
    assert res["layers"] == [1, 2] and [w["n"] for w in res["windows"]] == [2, 2]
    assert [e["step"] for e in res["evals"]] == [2, 4] and (tmp_path / "cmp" / "losses.png").exists()
    with pytest.raises(SystemExit, match="seed"):
        mod.main([str(tmp_path / "one"), str(tmp_path / "seed")])


def test_a_run_stopped_at_a_step_keeps_its_schedule_and_resumes_to_the_same_drafter(verifier_dir, tmp_path):
    """`--stop-at-step 3` of a 6-step schedule checkpoints step 3 (between two checkpoints of its
    own) and exports nothing; the rerun without it ends at the drafter of an uninterrupted run."""
    import vskip.distill.train as tr

    data = _tiny_data(tmp_path / "data")
    cfg = TrainConfig(num_layers=1, gamma=4, blocks_per_seq=2, batch_seqs=2, steps=6, warmup=1, lr=3e-3,
                      max_context=64, holdout=2, eval_every=1000, eval_blocks=4, checkpoint_every=4,
                      dtype="float32", threads=1)
    assert tr.train(data, tmp_path / "s", verifier_dir, cfg, progress=False, stop_at=3) is None
    assert tr.read_state_meta(tmp_path / "s")["step"] == 3 and not (tmp_path / "s" / "drafter").exists()
    assert tr.train(data, tmp_path / "s", verifier_dir, cfg, progress=False) == tmp_path / "s" / "drafter"
    tr.train(data, tmp_path / "whole", verifier_dir, cfg, progress=False)
    want, got = _final_weights(tmp_path / "whole"), _final_weights(tmp_path / "s")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
