"""``--preset``: what a decoding command starts from. The default is Strict SDD, lossless, in the
fastest shape measured; a skipping method, traces and a drafter of the user's keep the study
shape; ``study`` gives every committed study's defaults and ``paper`` the paper's; explicit
flags override a preset."""

import re
from pathlib import Path

import pytest

from vskip.commands import build_parser
from vskip.commands.flags import settings
from vskip.defaults import PRESETS, SHAPES, STANDALONE_DRAFTER
from vskip.engine.decode import DecodeConfig
from vskip.study import variants

ROOT = Path(__file__).resolve().parent.parent


def decode_of(*argv, command=("generate", "-")):
    s = settings(build_parser().parse_args([*command, *argv]))
    d = s.decode
    return s.policy.name, (d.gamma, d.gamma_max, d.min_match, d.trim, s.models.steps, s.models.drafter)


DEFAULT = (4, 16, 6, 0.3, 1, None)
STUDY = (8, None, 8, None, 1, None)
PAPER = (32, None, 8, None, 2, STANDALONE_DRAFTER)


def test_the_shapes_are_the_tuples_these_tests_name():
    keys = ("gamma", "gamma_max", "min_match", "trim", "steps", "drafter")
    assert tuple(SHAPES["default"][k] for k in keys) == DEFAULT
    assert tuple(SHAPES["study"][k] for k in keys) == STUDY
    assert tuple(SHAPES["paper"][k] for k in keys) == PAPER


@pytest.mark.parametrize("argv, policy, shape", [
    ((), "strict", DEFAULT),  # a new user: lossless, fastest shape
    (("--policy", "ar"), "ar", DEFAULT),
    (("--policy", "raw"), "raw", STUDY),  # a skipping method keeps the shape its gates were tuned in
    (("--policy", "lenience"), "lenience", STUDY),  # trimming would change what it accepts
    (("--policy", "prefix"), "prefix", STUDY),
    (("--drafter", "some/other/drafter"), "strict", (8, None, 8, None, 1, "some/other/drafter")),
    (("--drafter", STANDALONE_DRAFTER), "strict", DEFAULT[:5] + (STANDALONE_DRAFTER,)),
    (("--preset", "study"), "raw", STUDY),  # every committed study's defaults
    (("--preset", "study", "--policy", "strict"), "strict", STUDY),
    (("--preset", "paper"), "raw", PAPER),
    (("--preset", "paper", "--policy", "strict"), "strict", PAPER),
    (("--gamma", "8"), "strict", (8, 16, 6, 0.3, 1, None)),  # a flag overrides only itself
    (("--gamma", "16"), "strict", (16, None, 6, 0.3, 1, None)),  # growth gives way to a block as long
    (("--gamma", "32", "--gamma-max", "64"), "strict", (32, 64, 6, 0.3, 1, None)),
    (("--trim", "off"), "strict", (4, 16, 6, None, 1, None)),
    (("--gamma-max", "off"), "strict", (4, None, 6, 0.3, 1, None)),
    (("--trim", "0.5", "--min-match", "4"), "strict", (4, 16, 4, 0.5, 1, None)),
    (("--preset", "study", "--gamma-max", "16"), "raw", (8, 16, 8, None, 1, None)),
])
def test_a_preset_fills_what_the_flags_leave_out(argv, policy, shape):
    assert decode_of(*argv) == (policy, shape)


def test_traces_are_collected_in_the_study_shape():
    """Traces need whole blocks (no trimming), in the shape the predictors are trained on."""
    name, shape = decode_of("--task", "humaneval", "--trace", "--out", "x", command=("run",))
    assert (name, shape) == ("strict", STUDY)
    with pytest.raises(ValueError, match="whole blocks"):
        decode_of("--task", "humaneval", "--trace", "--trim", "0.5", "--out", "x", command=("run",))


def test_the_parsed_flags_are_left_as_given():
    """Settings are made from a copy: the server lays each request's keys over its own flags, and a
    request that names another policy must get that policy's shape."""
    a = build_parser().parse_args(["serve"])
    strict = settings(a)
    assert (a.policy, a.gamma, a.trim) == (None, None, None)
    a.policy = "raw"
    raw = settings(a)
    assert (strict.decode.gamma, strict.decode.trim) == (4, 0.3) and (raw.decode.gamma, raw.decode.trim) == (8, None)


def test_off_is_refused_where_a_number_is_needed():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "-", "--trim", "none"])


def test_every_preset_is_listed_with_its_policy_in_the_help(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name, preset in PRESETS.items():
        assert f"{name}: {' '.join(preset.help.split())}" in out


# --------------------------------------------------------------------------- compare

def start(policy):
    return settings(build_parser().parse_args(["compare"]), policy).decode


def test_compare_shapes_each_configuration_by_its_own_policy():
    strict = variants.parse_variant("strict", start, 1)
    raw = variants.parse_variant("raw+eta_b=0.7", start, 1)
    assert (strict.decode.gamma, strict.decode.trim) == (4, 0.3)
    assert (raw.decode.gamma, raw.decode.gamma_max, raw.decode.trim) == (8, None, None)
    longer = variants.parse_variant("strict+gamma=32", start, 1)
    assert (longer.decode.gamma, longer.decode.gamma_max) == (32, None)


@pytest.mark.parametrize("base", [DecodeConfig(gamma=8), DecodeConfig(gamma=4, gamma_max=16, min_match=6, trim=0.5),
                                  start])
def test_the_named_configurations_are_whole_shapes_whatever_the_command(base):
    default = variants.parse_variant("default", base, 1)
    fast = variants.parse_variant("fast", base, 1)
    paper = variants.parse_variant("paper", base, 1)
    d = default.decode
    assert (d.gamma, d.gamma_max, d.min_match, d.trim, default.steps, default.drafter) == DEFAULT[:5] + (STANDALONE_DRAFTER,)
    assert d.drafts == "payoff" and variants.parse_variant("drafted", base, 1).decode.drafts == "drafter"
    assert fast.decode.drafts == paper.decode.drafts == "drafter"
    d = fast.decode
    assert (d.gamma, d.gamma_max, d.min_match, d.trim, fast.steps) == (4, 16, 6, 0.5, 1)
    d = paper.decode
    assert (d.gamma, d.gamma_max, d.trim, paper.steps, paper.drafter) == (32, None, None, 2, STANDALONE_DRAFTER)


def test_the_named_configurations_are_what_the_committed_speed_figures_name():
    assert variants.DEFAULT == ("strict+gamma=4+gamma_max=16+min_match=6+trim=0.3+drafts=payoff"
                                "+drafter=smollm2-135m-diffusion")
    assert variants.DRAFTED == "strict+gamma=4+gamma_max=16+min_match=6+trim=0.3+drafter=smollm2-135m-diffusion"
    assert variants.FAST == "strict+gamma=4+gamma_max=16+min_match=6+trim=0.5+drafter=smollm2-135m-diffusion"
    assert variants.PAPER == "strict+gamma=32+steps=2+drafter=smollm2-135m-diffusion"


def test_compare_shows_ar_the_default_and_the_paper_by_default(monkeypatch, tmp_path):
    """... and llama.cpp's greedy decode where it is built, for the embedded verifier, greedy, batch 1."""
    from vskip.commands.compare import default_configs
    from vskip.commands.flags import decode_config, with_preset
    from vskip.study import llamacpp

    a = build_parser().parse_args(["compare"])
    assert a.configs is None
    dec = decode_config(with_preset(a, "strict"))
    monkeypatch.setattr(llamacpp, "server_binary", lambda: None)
    assert default_configs(a, dec) == "ar,strict,paper"
    monkeypatch.setattr(llamacpp, "server_binary", lambda: tmp_path / "llama-server")
    assert default_configs(a, dec) == "ar,strict,paper,llamacpp"
    for other in (["compare", "--batch-size", "2"], ["compare", "--verifier", str(tmp_path)]):
        b = build_parser().parse_args(other)
        assert default_configs(b, decode_config(with_preset(b, "strict"))) == "ar,strict,paper"


# --------------------------------------------------------------------------- the committed studies

_DECODING = re.compile(r"^\s*(?:\.venv/bin/)?vskip (run|compare|generate|serve)(\s|$)")


def results_commands(root: Path = ROOT):
    """Every decoding command written as a command line on a results page (continuations joined)."""
    out = []
    for page in sorted((root / "docs" / "results").glob("*.md")):
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            if _DECODING.match(lines[i]):
                cmd = lines[i]
                while cmd.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    cmd = cmd.rstrip()[:-1] + " " + lines[i]
                out.append((page.name, cmd.strip()))
            i += 1
    return out


def without_preset(root: Path = ROOT):
    return [(p, c) for p, c in results_commands(root) if "--preset" not in c and "--summary" not in c]


def test_every_results_command_names_the_preset_it_was_made_with():
    """A committed study is rerun as it was only with the defaults it was made with: a results
    page's decoding command names its preset (``--summary`` decodes nothing)."""
    assert len(results_commands()) > 10
    assert not without_preset(), without_preset()


def test_the_results_command_check_can_fail(tmp_path):
    page = tmp_path / "docs" / "results" / "x.md"
    page.parent.mkdir(parents=True)
    page.write_text("```\n  vskip compare --task humaneval \\\n  --configs ar,strict\nvskip run --preset study\n"
                    "vskip compare --summary --out x\n```\n")
    assert [" ".join(c.split()) for _, c in without_preset(tmp_path)] == ["vskip compare --task humaneval --configs ar,strict"]


# --------------------------------------------------------------------------- served requests

def test_a_served_request_gets_its_own_policys_shape():
    """A request's ``vskip`` keys go over the server's flags and the preset fills the rest for the
    request's own policy; a preset that needs another drafter or reveal steps than the server
    loaded is refused, naming the key."""
    from vskip.serve.protocol import ApiError, CompletionRequest, request_settings

    a = build_parser().parse_args(["serve"])

    def shape(vskip):
        s = request_settings(a, CompletionRequest(prompt="x", vskip=vskip), 30, 64, settings)
        return s.policy.name, s.decode.gamma, s.decode.gamma_max, s.decode.trim

    assert shape(None) == ("strict", 4, 16, 0.3)
    assert shape({"policy": "raw"}) == ("raw", 8, None, None)
    assert shape({"preset": "study"}) == ("raw", 8, None, None)
    assert shape({"preset": "study", "policy": "strict", "trim": 0.4}) == ("strict", 8, None, 0.4)
    for vskip, key in (({"preset": "paper"}, "vskip.preset"), ({"preset": "nope"}, "vskip.preset"),
                       ({"preset": 1}, "vskip.preset")):
        with pytest.raises(ApiError) as e:
            shape(vskip)
        assert e.value.param == key
    # the server hands in the models it loaded (not made again per request): a server of the
    # paper's preset serves it, and refuses the default's drafter
    paper = settings(build_parser().parse_args(["serve", "--preset", "paper"])).models
    ok = request_settings(a, CompletionRequest(prompt="x", vskip={"preset": "paper"}), 30, 64, settings, paper)
    assert (ok.decode.gamma, ok.models.steps) == (32, 2)
    with pytest.raises(ApiError, match="this server loaded smollm2-135m-diffusion"):
        request_settings(a, CompletionRequest(prompt="x"), 30, 64, settings, paper)
