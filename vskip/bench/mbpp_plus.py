"""MBPP+ from a user's EvalPlus ``MbppPlus.jsonl``: problems whose tests compare the solution's
output with the reference solution's on the base and plus inputs (see
:func:`load_mbpp_plus_file`). Nothing here imports torch."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..files import read_jsonl_lines
from .tasks import Problem

# ----------------------------------------------------------------------------- MBPP+ files

# How EvalPlus's MbppPlus.jsonl stores inputs that are not JSON types: per task id, the
# conversion its loader applies before calling the function (tuples, sets, complex numbers).
_MBPP_PLUS_CONVERSIONS = {
    "args_to_tuples": (2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579,
                       596, 616, 630, 726, 740, 744, 809),
    "arg_items_to_tuples": (63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614,
                            780),
    "first_arg_items_to_tuples": (75, 413, 444, 753),
    "second_arg_to_tuple": (106, 750),
    "first_arg_to_tuple": (250, 405, 446, 617, 720, 763, 808),
    "nested_args_to_tuples": (259, 401, 445),
    "first_arg_lists_to_tuples_then_args": (278,),
    "first_of_three_to_tuple": (307,),
    "dict_values_to_tuples": (722,),
    "complex_first": (252,),
    "float_complex": (124,),
    "sets_in_first": (115,),
    "all_lists_to_tuples": (580, 615, 791),
}

# The conversion functions, written into the harness (they run inside the sandbox).
_CONVERT_SRC = r'''
def _vs_tuples(x):
    return tuple(_vs_tuples(i) for i in x) if isinstance(x, list) else x

def _vs_convert(kind, inputs):
    out = []
    for a in inputs:
        if kind == "args_to_tuples":
            a = [tuple(v) for v in a]
        elif kind == "arg_items_to_tuples":
            a = [[tuple(v) for v in arg] for arg in a]
        elif kind == "first_arg_items_to_tuples":
            a = [[tuple(v) for v in a[0]]] + list(a[1:])
        elif kind == "second_arg_to_tuple":
            a = [a[0], tuple(a[1])] + list(a[2:])
        elif kind == "first_arg_to_tuple":
            a = [tuple(a[0])] + list(a[1:])
        elif kind == "nested_args_to_tuples":
            a = [tuple(tuple(v) for v in arg) for arg in a]
        elif kind == "first_arg_lists_to_tuples_then_args":
            a = [tuple(tuple(v) if isinstance(v, list) else v for v in a[0])] + list(a[1:])
            a = [tuple(v) if isinstance(v, list) else v for v in a]
        elif kind == "first_of_three_to_tuple":
            a = [tuple(a[0])] + list(a[1:])
        elif kind == "dict_values_to_tuples":
            a = [{k: tuple(v) for k, v in a[0].items()}] + list(a[1:])
        elif kind == "complex_first":
            a = [complex(a[0])] + list(a[1:])
        elif kind == "float_complex":
            a = [float(a[0]), complex(a[1])]
        elif kind == "sets_in_first":
            a = [[set(v) if isinstance(v, list) and v else {} for v in a[0]]]
        elif kind == "all_lists_to_tuples":
            a = _vs_tuples(a)
        out.append(a)
    return out
'''

_MBPP_PLUS_HARNESS = '''
# ---- MBPP+ harness: expected outputs come from the reference solution ----
import copy as _vs_copy
import json as _vs_json
import math as _vs_math
{convert}
_VS_INPUTS = _vs_convert({kind!r}, _vs_json.loads({inputs!r}))
_VS_ATOL = {atol!r}

def _vs_floats(x):
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False

def _vs_close(out, exp, atol):
    if isinstance(exp, float) or isinstance(out, float):
        if not isinstance(out, (int, float)) or isinstance(out, bool):
            return False
        return _vs_math.isclose(out, exp, rel_tol=1e-07, abs_tol=atol)
    if isinstance(exp, (list, tuple)):
        return (type(out) is type(exp) and len(out) == len(exp)
                and all(_vs_close(o, e, atol) for o, e in zip(out, exp)))
    return out == exp

def _vs_same(out, exp, atol):
    if out == exp:
        return True
    if atol == 0 and _vs_floats(exp):
        atol = 1e-6
    return atol != 0 and _vs_close(out, exp, atol)

_vs_ref_ns = {{}}
exec(compile({reference!r}, "<reference>", "exec"), _vs_ref_ns)
_vs_reference = _vs_ref_ns[{entry!r}]
_vs_candidate = {entry}
for _vs_i, _vs_args in enumerate(_VS_INPUTS):
    _vs_exp = _vs_reference(*_vs_copy.deepcopy(_vs_args))
    _vs_out = _vs_candidate(*_vs_copy.deepcopy(_vs_args))
    assert _vs_same(_vs_out, _vs_exp, _VS_ATOL), "input %d: got %r, expected %r" % (
        _vs_i, _vs_out, _vs_exp)
'''


def _as_list(value, field: str, where: str):
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{where}: field {field} is not JSON ({exc})") from None
    if not isinstance(value, list):
        raise ValueError(f"{where}: field {field} must be a list of argument lists")
    return value


def load_mbpp_plus_file(path) -> list[Problem]:
    """Problems from a user-supplied EvalPlus ``MbppPlus.jsonl`` (plain or ``.gz``).

    A record's ``test`` code, when present, is used as is. Otherwise the test is built from
    ``base_input`` + ``plus_input`` (and ``atol``): the program compares the solution's output
    with the reference solution's on every input, equal or within ``atol`` for floats (EvalPlus's
    rule; its few task-specific oracles and per-input time limits are not reproduced).
    """
    path = Path(path)
    kinds = {i: k for k, ids in _MBPP_PLUS_CONVERSIONS.items() for i in ids}
    problems = []
    for n, rec in read_jsonl_lines(path, given="MBPP+ file"):
        where = f"{path} line {n}"
        missing = [k for k in ("task_id", "prompt", "entry_point", "canonical_solution")
                   if k not in rec]
        if missing:
            raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
        tid = str(rec["task_id"])
        if not tid.startswith("Mbpp/"):
            tid = f"Mbpp/{tid}"
        try:
            num = int(tid.split("/", 1)[1])
        except ValueError:
            raise ValueError(f"{where}: task_id {rec['task_id']!r} is not Mbpp/<number>") from None
        prompt = rec["prompt"]
        if not re.search(r"^\s*assert\b", prompt, flags=re.M) and rec.get("assertion"):
            first = next((ln.strip() for ln in str(rec["assertion"]).splitlines()
                          if ln.strip().startswith("assert")), None)
            if first:
                prompt = prompt.rstrip() + "\n" + first + "\n"
        if isinstance(rec.get("test"), str) and rec["test"].strip():
            test = rec["test"]
        else:
            if "base_input" not in rec:
                raise ValueError(f"{where}: needs either test or base_input/plus_input")
            inputs = _as_list(rec["base_input"], "base_input", where)
            inputs += _as_list(rec.get("plus_input") or [], "plus_input", where)
            atol = float(rec.get("atol") or 0)
            test = _MBPP_PLUS_HARNESS.format(
                convert=_CONVERT_SRC, kind=kinds.get(num, "none"), inputs=json.dumps(inputs),
                atol=atol, reference=rec["canonical_solution"], entry=rec["entry_point"],
            )
        problems.append(Problem(
            task="mbpp_plus",
            task_id=tid,
            prompt=prompt,
            entry_point=rec["entry_point"],
            test=test,
            reference=rec["canonical_solution"],
        ))
    if not problems:
        raise ValueError(f"MBPP+ file {path} holds no records")
    return problems
