"""scripts/security_report.py counts what the tests say: a failed hostile test is an escape in the
mode it ran in, a failed bad-input probe is counted by the way it failed."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("security_report", ROOT / "scripts" / "security_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _case(name, file, outcome="passed", message=""):
    return {"name": name, "file": file, "outcome": outcome, "message": message}


def test_counts_per_mode_and_by_failure(report, monkeypatch):
    monkeypatch.setattr(report.sandbox, "sandbox_kind", lambda mode: "bubblewrap")
    cases = [
        _case("test_fork_bomb[bubblewrap]", "tests.test_sandbox"),
        _case("test_network_socket[namespaces]", "tests.test_sandbox", "failed", "socket connected"),
        _case("test_output_flood[bubblewrap-stdout]", "tests.test_sandbox"),
        _case("test_passing_and_failing_programs[bubblewrap]", "tests.test_sandbox"),  # not hostile
        _case("test_hostile_completion_does_not_pass[forge_gc_scan-auto]", "tests.test_scoring"),
        _case("test_hostile_completion_does_not_pass[forge_frame_walk-namespaces]", "tests.test_scoring", "failed"),
        _case("test_bad_input_is_one_line_naming_the_problem[a]", "tests.test_bad_input"),
        _case("test_bad_input_is_one_line_naming_the_problem[b]", "tests.test_bad_input", "failed",
              "assert 'Traceback' not in err"),
        _case("test_bad_input_is_one_line_naming_the_problem[c]", "tests.test_bad_input", "failed", "assert rc == 2"),
    ]
    got = report.tabulate(cases)
    modes = got["modes"]
    assert modes["bubblewrap"]["hostile_programs"] == {"run": 2, "contained": 2}
    assert modes["namespaces"]["hostile_programs"] == {"run": 1, "escaped": 1}
    assert modes["bubblewrap"]["hostile_completions"] == {"run": 1, "not a pass": 1}
    assert modes["namespaces"]["hostile_completions"] == {"run": 1, "forged or escaped": 1}
    assert got["bad_input"] == {"probes": 3, "clean": 1, "traceback": 1, "wrong exit status": 1}
    assert len(got["failed_tests"]) == 4
    text = report.markdown(got, "python scripts/security_report.py")
    assert "| namespaces | stands in as bubblewrap | 1 | 0 | 1 | 1 | 0 | 1 |" in text


def test_routes_and_residual_routes_are_counted_per_mode(report, monkeypatch):
    monkeypatch.setattr(report.sandbox, "sandbox_kind", lambda mode: "bubblewrap")
    cases = [
        _case("test_forged_pass_route[hook_reentry_import_name-auto]", "tests.test_verdict"),
        _case("test_forged_pass_route[hook_reentry_builtin-namespaces]", "tests.test_verdict", "failed", "forged"),
        _case("test_forged_pass_route[namespace_swap_through_main-auto]", "tests.test_verdict"),
        _case("test_forged_pass_route[prompt_helper_patched-auto]", "tests.test_verdict"),
        _case("test_hostile_completion_does_not_pass[forge_gc_scan-auto]", "tests.test_scoring"),
        _case("test_residual_always_equal_result[auto]", "tests.test_verdict"),
        _case("test_residual_native_code_from_a_written_file[namespaces]", "tests.test_verdict", "failed",
              "EXEC\nmore"),
    ]
    got = report.tabulate(cases)
    routes = got["routes"]
    assert routes["1. re-entering the verdict's audit hook"] == {
        "bubblewrap": {"run": 1, "not a pass": 1}, "namespaces": {"run": 1, "forged or escaped": 1}}
    assert routes["2. swapping the runner's namespace"] == {"bubblewrap": {"run": 1, "not a pass": 1}}
    assert routes[report.CHEAP] == {"bubblewrap": {"run": 1, "not a pass": 1}}
    assert got["modes"]["bubblewrap"]["hostile_completions"] == {"run": 4, "not a pass": 4}
    assert got["residual"] == {"always_equal_result": {"bubblewrap": "as documented"},
                               "native_code_from_a_written_file": {"namespaces": "differs: EXEC"}}
    text = report.markdown(got, "python scripts/security_report.py")
    assert "| 1. re-entering the verdict's audit hook | 1 / 1 / 0 | 1 / 0 / 1 |" in text
    assert "| native code from a written file | not run | differs: EXEC |" in text
