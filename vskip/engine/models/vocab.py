"""Whether a drafter's vocabulary fits the verifier's: the head outputs it may propose, from the
two tokenizers (or their token tables, read from the tokenizer files alone)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

#: Above this share of shared ids that decode differently, a drafter's vocabulary does not fit.
MAX_VOCAB_MISMATCH = 0.01


def vocabulary_fit(drafter_tok, verifier_tok, head_ids: torch.Tensor, verifier_len: int) -> torch.Tensor:
    """Which head outputs may be proposed: ids the verifier's vocabulary has, decoding to the same
    string in both tokenizers. Raises when the vocabularies do not fit at all."""
    ids = head_ids.tolist()
    allowed = torch.tensor([i < verifier_len for i in ids])
    if drafter_tok is None:
        return allowed
    d = drafter_tok.convert_ids_to_tokens([i for i in ids if i < min(verifier_len, len(drafter_tok))])
    v = verifier_tok.convert_ids_to_tokens([i for i in ids if i < min(verifier_len, len(drafter_tok))])
    same = {i for i, a, b in zip(ids, d, v) if a == b}
    mismatch = 1.0 - len(same) / max(len(d), 1)
    if mismatch > MAX_VOCAB_MISMATCH:
        raise ValueError(
            f"the drafter's vocabulary does not fit the verifier: {mismatch:.1%} of shared token ids decode differently"
        )
    return torch.tensor([i in same for i in ids])


class TokenTable:
    """Token id -> token string of a tokenizer directory, read from its data files alone
    (``tokenizer.json``, or ``vocab.json`` with ``tokenizer_config.json``'s and
    ``added_tokens.json``'s added tokens): DiffuCoder ships a slow tokenizer whose class is remote
    code, and :func:`vocabulary_fit` needs only this table."""

    def __init__(self, table: dict[int, str]):
        self.table = table
        self.size = max(table) + 1 if table else 0

    def __len__(self) -> int:
        return self.size

    def convert_ids_to_tokens(self, ids):
        return [self.table.get(int(i)) for i in ids]


def read_token_table(d: Path) -> TokenTable | None:
    """The :class:`TokenTable` of tokenizer files in ``d``, or None when it holds none."""
    d = Path(d)
    table: dict[int, str] = {}
    try:
        if (d / "tokenizer.json").exists():
            t = json.loads((d / "tokenizer.json").read_text())
            vocab = t["model"]["vocab"]
            if isinstance(vocab, dict):
                table = {int(i): s for s, i in vocab.items()}
            else:  # unigram: [piece, score] in id order
                table = {i: piece[0] for i, piece in enumerate(vocab)}
            table |= {int(a["id"]): a["content"] for a in t.get("added_tokens", [])}
        elif (d / "vocab.json").exists():
            table = {int(i): s for s, i in json.loads((d / "vocab.json").read_text()).items()}
        else:
            return None
        if (d / "tokenizer_config.json").exists():
            cfg = json.loads((d / "tokenizer_config.json").read_text())
            table |= {int(i): a["content"] for i, a in (cfg.get("added_tokens_decoder") or {}).items()}
        if (d / "added_tokens.json").exists():
            table |= {int(i): s for s, i in json.loads((d / "added_tokens.json").read_text()).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"the tokenizer files in {d} cannot be read: {e}") from None
    return TokenTable(table)
