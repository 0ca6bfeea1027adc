"""Leakage check by similarity: training prompts that resemble an evaluation item.

The prompt list already drops exact copies of evaluation items (by content hash,
:mod:`vskip.distill.prompts`). A reworded item passes that test. For example, a CodeI/O task
asking for "the largest prime factor of `n`" as a function whose output key is
`largest_prime_factor` is HumanEval/59 and MBPP/32 in other words. This module flags such prompts
with four rules. Each compares the content inside a prompt's template with every evaluation item
of its domain:

``copy``
    at least :data:`COPY_SHARE` of an item's word 8-grams occur in the prompt (items of 8 words
    or more; words are letters and digits, so a maths problem is compared by its wording): copied
    text, lightly edited, or a problem of the same wording with other numbers;
``description``
    code (HumanEval, MBPP against the stdlib and CodeI/O prompts): the cosine of word uni- and
    bigram TF-IDF vectors (English stop words removed) is at least :data:`CODE_COSINE`. The
    weights are fitted on the items and the prompts compared together (fitted on the items
    alone, a long prompt's words outside their vocabulary would drop out and inflate its
    cosine), so a score depends a little on the batch;
``function name``
    code: the prompt names an item's function (an identifier with an underscore, at least 8
    characters, e.g. ``largest_prime_factor``), and their cosine is at least :data:`NAME_COSINE`;
``problem``
    maths (MATH-500, GSM8K against the MATH problems): the cosine of character 3-5-gram TF-IDF
    vectors, symbols included, is at least :data:`MATH_COSINE`. This catches the same problem
    restated, and also siblings built on one template with other numbers; both are flagged.

The thresholds were set by reading the highest-scoring pairs of the 9,424 prompts, and they are
deliberately loose: a flagged prompt costs one training answer out of thousands. Flagged prompts
are listed in ``leakage.json`` beside the data. Training and the copy prior's fit skip them, and
the generator still answers them, so that the shards keep their order. Make the list with::

    vskip flag-leakage --data datasets/distill
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

LEAKAGE_FILE = "leakage.json"
COPY_SHARE = 0.5
CODE_COSINE = 0.40
NAME_COSINE = 0.15
MATH_COSINE = 0.90
CODE_TASKS = ("humaneval", "mbpp")
MATH_TASKS = ("math500", "gsm8k")
_WORD = re.compile(r"[a-z0-9]+")
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


@dataclass(frozen=True)
class Flag:
    prompt_id: str
    source: str
    item: str  # the evaluation item's task id
    rule: str  # copy | description | function name | problem
    score: float


@dataclass(frozen=True)
class EvalItem:
    task_id: str
    text: str
    name: str | None  # the function it asks for (code)


def eval_corpus() -> dict[str, list[EvalItem]]:
    """Every evaluation item the harness scores, per domain (``code``, ``math``)."""
    from ..bench import tasks

    out: dict[str, list[EvalItem]] = {"code": [], "math": []}
    for domain, names in (("code", CODE_TASKS), ("math", MATH_TASKS)):
        for task in names:
            for p in tasks.load_task(task):
                out[domain].append(EvalItem(p.task_id, p.prompt, p.entry_point))
    return out


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _grams(words: list[str], n: int = 8) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def _distinctive(name: str | None) -> bool:
    return bool(name) and "_" in name.strip("_") and len(name) >= 8


def _compared_text(prompt, content: str) -> str:
    """A prompt's short view: a CodeI/O task's description (its first paragraph, without the
    input/output boilerplate that dilutes a short description), else the content inside the
    template."""
    if prompt.source == "codeio":
        return content.split("\n\n", 1)[0]
    return content


def find_leaks(prompts, corpus: dict[str, list[EvalItem]] | None = None) -> list[Flag]:
    """The flags of ``prompts`` (:class:`~vskip.distill.prompts.TrainPrompt`), at most one per
    prompt (the first rule that fires, against its most similar item)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from .prompts import prompt_content

    corpus = eval_corpus() if corpus is None else corpus
    prompts = list(prompts)
    flags: dict[str, Flag] = {}
    for domain, kw, threshold, rule in (
        ("code", dict(ngram_range=(1, 2), stop_words="english"), CODE_COSINE, "description"),
        ("math", dict(analyzer="char_wb", ngram_range=(3, 5)), MATH_COSINE, "problem"),
    ):
        items = corpus[domain]
        mine = [p for p in prompts if (p.source == "math") == (domain == "math")]
        if not items or not mine:
            continue
        full = [prompt_content(p) for p in mine]
        short = [_compared_text(p, t) for p, t in zip(mine, full)]
        sim = None  # the larger cosine of the two views of a prompt: its description, its whole content
        for texts in ({id(full): full, id(short): short}.values()):
            vec = TfidfVectorizer(sublinear_tf=True, **kw).fit(texts + [e.text for e in items])
            s = (vec.transform(texts) @ vec.transform([e.text for e in items]).T).tocsr()
            sim = s if sim is None else sim.maximum(s)
        item_grams = [_grams(_words(e.text)) for e in items]
        by_name: dict[str, list[int]] = {}
        for j, e in enumerate(items):
            if domain == "code" and _distinctive(e.name):
                by_name.setdefault(e.name, []).append(j)
        for i, (p, text) in enumerate(zip(mine, full)):
            row = sim.getrow(i)
            scores = dict(zip(row.indices.tolist(), row.data.tolist()))
            grams = _grams(_words(text))
            found = None
            for j, g in enumerate(item_grams):
                if g and grams and len(g & grams) >= COPY_SHARE * len(g):
                    found = Flag(p.prompt_id, p.source, items[j].task_id, "copy", round(len(g & grams) / len(g), 3))
                    break
            if found is None and scores:
                j = max(scores, key=scores.get)
                if scores[j] >= threshold:
                    found = Flag(p.prompt_id, p.source, items[j].task_id, rule, round(scores[j], 3))
            if found is None and by_name:
                for name in sorted(set(_IDENT.findall(text)) & set(by_name)):
                    j = max(by_name[name], key=lambda k: scores.get(k, 0.0))
                    if scores.get(j, 0.0) >= NAME_COSINE:
                        found = Flag(p.prompt_id, p.source, items[j].task_id, "function name", round(scores[j], 3))
                        break
            if found is not None:
                flags[p.prompt_id] = found
    return [flags[p.prompt_id] for p in prompts if p.prompt_id in flags]


def flagged_ids(data_dir: Path) -> frozenset[str]:
    """The prompt ids ``leakage.json`` in ``data_dir`` flags (none when it has no such file)."""
    path = Path(data_dir) / LEAKAGE_FILE
    if not path.exists():
        return frozenset()
    from ..files import read_json

    data = read_json(path, "leakage list")
    try:
        return frozenset(f["prompt_id"] for f in data["flagged"])
    except (KeyError, TypeError):
        raise ValueError(f"{path} is not a leakage list; remake it with python -m vskip.distill.leakage") from None


def write_leakage(data_dir: Path, prompts, flags: list[Flag]) -> dict:
    from collections import Counter

    from ..files import write_json

    record = {
        "command": f"vskip flag-leakage --data {data_dir}",
        "rules": {"copy_share": COPY_SHARE, "code_cosine": CODE_COSINE, "name_cosine": NAME_COSINE,
                  "math_cosine": MATH_COSINE},
        "prompts": len(prompts),
        "flagged_count": len(flags),
        "by_rule": dict(sorted(Counter(f.rule for f in flags).items())),
        "by_source": dict(sorted(Counter(f.source for f in flags).items())),
        "flagged": [asdict(f) for f in flags],
    }
    write_json(Path(data_dir) / LEAKAGE_FILE, record)
    return record
