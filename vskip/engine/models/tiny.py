"""Tiny randomly initialised checkpoints in the layouts of the paper's pair, for tests and for
``scripts/gpu_check.sh``: a Qwen3 verifier and a Dream (DiffuCoder) drafter whose tokenizers carry
the same special tokens, in the same order and with the same flags, as the real ones.

The real tokenizers share a byte-level BPE vocabulary of 151,643 entries, then added tokens from
id 151643. Qwen2.5 (and so DiffuCoder) and Qwen3 agree on the first 22 of them; past those, the
two read the same ids differently: DiffuCoder's ``<|beginoftext|>``, ``<|mask|>`` and
``<|dlm_pad|>`` (151665-151667) are Qwen3's ``<tool_response>``, ``</tool_response>`` and
``<think>``. The tiny tokenizers keep that layout above a base vocabulary of :data:`BASE` entries
(the 256 byte symbols and 256 merges), so tiny id ``BASE + i`` stands for real id ``151643 + i``.

Nothing here reads a model hub; the values were written in from the public configs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

#: the first added-token id of the real Qwen2.5/Qwen3/DiffuCoder tokenizers
REAL_FIRST_ADDED = 151643

#: (content, special) of ids 151643-151664, shared by Qwen2.5, DiffuCoder and Qwen3
QWEN_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
]
#: Qwen3's ids 151665-151668
QWEN3_EXTRA = [("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False)]
#: DiffuCoder's ids 151665-151667 (mask_token_id 151666 in its config.json)
DIFFUCODER_EXTRA = [("<|beginoftext|>", True), ("<|mask|>", True), ("<|dlm_pad|>", True)]

#: base vocabulary of the tiny tokenizers: 256 byte symbols and 256 merges
BASE = 512
#: the tiny models' embedding rows (the real ones pad theirs too: 151936 and 152064)
VERIFIER_VOCAB = BASE + 32
DRAFTER_VOCAB = BASE + 64

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: ChatML with Qwen3's thinking switch: ``enable_thinking=False`` opens the answer with an empty
#: thinking block (our own template, written for the tiny tokenizer)
CHATML_THINKING = CHATML[: -len("{% endif %}")] + (
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def tiny_id(real_id: int) -> int:
    """The tiny tokenizers' id of a real added-token id."""
    return BASE + real_id - REAL_FIRST_ADDED


def _base_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    firsts, seconds = "Ġetaoinsrhldcumfpgwybv", "etaoinsrhldcumfpgwybvkx_(Ġ"
    for a in firsts:
        for b in seconds:
            if len(vocab) == BASE:
                return vocab, merges
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append((a, b))
    raise AssertionError("too few merges for the base vocabulary")


def _verifier_tokenizer(added, template: str = CHATML):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab, merges = _base_vocab()
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    for content, special in added:  # one at a time: ids follow the list's order
        tk.add_tokens([AddedToken(content, special=special, normalized=False)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = template
    return tok


def _randomize(model, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():  # peakier logits, so that greedy decoding is less degenerate
        model.get_input_embeddings().weight.mul_(3.0)
        model.get_output_embeddings().weight.normal_(0.0, 1.0)


def tiny_qwen3(out: Path, seed: int = 0, layers: int = 4) -> Path:
    """A tiny Qwen3 verifier with Qwen3's added tokens (eos ``<|im_end|>`` and ``<|endoftext|>``)."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out = Path(out)
    added = QWEN_ADDED + QWEN3_EXTRA
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=VERIFIER_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
                      rope_theta=1e6, tie_word_embeddings=False, bos_token_id=tiny_id(151643),
                      eos_token_id=tiny_id(151645))
    model = Qwen3ForCausalLM(cfg).eval()
    _randomize(model, seed)
    model.generation_config = GenerationConfig(eos_token_id=[tiny_id(151645), tiny_id(151643)],
                                               pad_token_id=tiny_id(151643))
    model.save_pretrained(out, safe_serialization=True)
    _verifier_tokenizer(added, CHATML_THINKING).save_pretrained(out)
    return out


def tiny_dream(out: Path, seed: int = 1, layers: int = 2, favour: tuple[int, ...] = ()) -> Path:
    """A tiny Dream drafter in DiffuCoder's layout: Qwen2 module names, ``model_type`` Dream,
    ``mask_token_id`` at DiffuCoder's place, and a slow-tokenizer directory (``vocab.json``,
    ``merges.txt``, ``tokenizer_config.json`` naming remote code) like DiffuCoder's. Its remote
    code files raise if anything runs them. ``favour``: ids whose output rows are made large, so
    that the network prefers them (to test that ids the verifier reads differently are never
    proposed)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=DRAFTER_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, rope_theta=1e6,
                      tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval()
    _randomize(model, seed)
    if favour:
        with torch.no_grad():
            w = model.lm_head.weight
            w[list(favour)] = torch.randn(len(favour), w.shape[1]) * 20.0
    model.save_pretrained(out, safe_serialization=True)
    c = json.loads((out / "config.json").read_text())
    c.update(model_type="Dream", architectures=["DreamModel"], mask_token_id=tiny_id(151666),
             bos_token_id=tiny_id(151643), eos_token_id=tiny_id(151643), pad_token_id=tiny_id(151643),
             auto_map={"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"})
    (out / "config.json").write_text(json.dumps(c, indent=2))
    for name in ("modeling_dream.py", "configuration_dream.py", "tokenization_dream.py"):
        (out / name).write_text("raise RuntimeError('checkpoint code was executed')\n")
    vocab, merges = _base_vocab()
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    added = QWEN_ADDED + DIFFUCODER_EXTRA
    decoder = {str(BASE + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                               "single_word": False, "special": s} for i, (t, s) in enumerate(added)}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": decoder, "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "tokenizer_class": "DreamTokenizer", "bos_token": "<|beginoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": "<|dlm_pad|>", "mask_token": "<|mask|>", "chat_template": CHATML,
    }, indent=2))
    return out


#: ids the tiny drafter's tokenizer and the tiny verifier's read differently
CLASHING_IDS = tuple(tiny_id(i) for i in (151665, 151666, 151667))


def tiny_dflash(out: Path, target: Path, seed: int = 2, layers: int = 2, block_size: int = 8,
                target_layers: tuple[int, ...] = (0, 2)) -> Path:
    """A tiny DFlash drafter for the tiny Qwen3 target in ``target``, in the published layout:
    ``config.json`` (``DFlashDraftModel``, model type qwen3, ``auto_map`` to a ``dflash.py`` that
    raises if anything runs it, ``block_size`` at the top level, ``dflash_config`` with the mask
    token, past the tokenizer's last id, and the tapped layers) and one safetensors file named as
    the published ones (``fc``, ``hidden_norm``, ``layers.N.*`` with ``q_norm``/``k_norm``,
    ``norm``; no embedding or head)."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t = json.loads((Path(target) / "config.json").read_text())
    torch.manual_seed(seed)
    body = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=t["vocab_size"], hidden_size=t["hidden_size"], intermediate_size=t["intermediate_size"],
        num_hidden_layers=layers, num_attention_heads=t["num_attention_heads"],
        num_key_value_heads=t["num_key_value_heads"], head_dim=t["head_dim"], rope_theta=1e6))
    sd = {k[len("model."):]: v for k, v in body.state_dict().items()
          if k.startswith("model.") and "embed_tokens" not in k and "rotary" not in k}
    with torch.no_grad():
        for k, v in sd.items():  # norms away from 1, so that a missing norm shows
            if k.endswith("norm.weight"):
                v.uniform_(0.5, 1.5)
            else:
                v.mul_(4.0)
    d = t["hidden_size"]
    sd["fc.weight"] = torch.randn(d, len(target_layers) * d) / (len(target_layers) * d) ** 0.5
    sd["hidden_norm.weight"] = torch.rand(d) + 0.5
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}, str(out / "model.safetensors"))
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
           "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": block_size,
           "dflash_config": {"mask_token_id": int(t["vocab_size"]) - 1, "target_layer_ids": list(target_layers)},
           "num_target_layers": t["num_hidden_layers"], "num_hidden_layers": layers, "hidden_size": d,
           "intermediate_size": t["intermediate_size"], "num_attention_heads": t["num_attention_heads"],
           "num_key_value_heads": t["num_key_value_heads"], "head_dim": t["head_dim"], "rope_theta": 1e6,
           "rope_scaling": None, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "attention_bias": False,
           "hidden_act": "silu", "layer_types": ["full_attention"] * layers, "tie_word_embeddings": False,
           "vocab_size": t["vocab_size"], "dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "dflash.py").write_text("raise RuntimeError('checkpoint code was executed')\n")
    return out
