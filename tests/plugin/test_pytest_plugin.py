"""The pytest plugin through ``pytester``: collection rules, suites, invalid documents, options
and their bad values, the fixture and the marker — without launching a job — and one session
of real runs (a failing item's SLA table, the marker's passing result, the JUnit properties of
both; passing items are the shipped experiments that make test runs)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest
from pytest_faultlab.plugin import (
    BAD_DIRECTORY,
    BAD_INTEGER,
    BAD_MARKER,
    BAD_PASS_RATE,
    BAD_REPEAT,
    INCONCLUSIVE,
    INVALID_EXPERIMENT,
    JOURNAL,
    MARKER_WITHOUT_FIXTURE,
    MISSING_PATH,
    NO_MARKER,
    PASS_RATE_WITHOUT_REPEAT,
    REPEAT_FAILED,
    RUN_ERROR,
    SLA_FAILED,
    STOPPED_BEFORE_LAUNCH,
    SUITE_IN_RUN,
    repeat_table,
    sla_table,
)

pytest_plugins = ["pytester"]

TINY = """\
name: {name}
seed: 0
target: {{trainer: reference, preset: tiny}}
topology: {{nodes: 1, procs_per_node: 1}}
run: {{steps: 12, checkpoint_every: 5, timeout_s: 240}}
faults:
  - id: kill-rank-0
    type: rank_kill
    target: {{rank: 0}}
    trigger: {{at_step: 6}}
expect:
  completes: true
{expect}"""

PASSING = "  max_restarts: 1\n  lost_steps: 5\n  samples_exactly_once: true\n"
FAILING = "  resume_time_s: 0.001\n"


def tiny(name: str, expect: str = PASSING) -> str:
    return TINY.format(name=name, expect=expect)


def bad(name: str = "bad") -> str:
    return tiny(name).replace("at_step: 6", "at_step: ten")


def collected(result: pytest.RunResult) -> list[str]:
    return sorted(line for line in result.outlines if "::" in line)


# ---------------------------------------------------------------------------- collection


def test_yaml_given_on_the_command_line_is_one_item_named_after_its_experiment(
        pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", kill=tiny("my_kill"))
    result = pytester.runpytest_subprocess("kill.yaml", "--collect-only", "-q")
    assert collected(result) == ["kill.yaml::my_kill"]


def test_plain_pytest_collects_no_yaml_and_the_option_only_experiments(
        pytester: pytest.Pytester) -> None:
    pytester.mkdir("exps")
    (pytester.path / "exps" / "kill.yaml").write_text(tiny("kill"))
    (pytester.path / "exps" / "ci.yaml").write_text("jobs: {build: {runs-on: x}}\nname: ci\n")
    (pytester.path / "other.yaml").write_text(tiny("elsewhere"))
    pytester.makepyfile(test_plain="def test_ok(): pass")

    plain = pytester.runpytest_subprocess("--collect-only", "-q")
    assert collected(plain) == ["test_plain.py::test_ok"]

    opt = pytester.runpytest_subprocess("--collect-only", "-q", "--faultlab-experiments", "exps")
    assert collected(opt) == ["exps/kill.yaml::kill", "test_plain.py::test_ok"]


def test_ini_paths_are_added_only_when_pytest_is_given_no_paths(
        pytester: pytest.Pytester) -> None:
    pytester.mkdir("exps")
    (pytester.path / "exps" / "kill.yaml").write_text(tiny("kill"))
    pytester.makeini("[pytest]\nfaultlab_experiments = exps\n")
    pytester.makepyfile(test_plain="def test_ok(): pass")
    assert collected(pytester.runpytest_subprocess("--collect-only", "-q")) == [
        "exps/kill.yaml::kill", "test_plain.py::test_ok"]
    assert collected(pytester.runpytest_subprocess("test_plain.py", "--collect-only", "-q")) \
        == ["test_plain.py::test_ok"]


def test_a_suite_yields_one_item_per_member_in_order(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", a=tiny("alpha"), b=tiny("beta"),
                      suite="name: both\nsuite: [b.yaml, a.yaml]\n")
    result = pytester.runpytest_subprocess("suite.yaml", "--collect-only", "-q")
    assert [line for line in result.outlines if "::" in line] == [
        "suite.yaml::beta", "suite.yaml::alpha"]


def test_an_invalid_experiment_is_one_failing_item_with_located_problems_and_runs_nothing(
        pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", bad=bad("broken"), good=tiny("fine"))
    result = pytester.runpytest_subprocess("bad.yaml", "-n", "2", "--collect-only", "-q")
    assert collected(result) == ["bad.yaml::broken"]  # collection itself does not crash

    result = pytester.runpytest_subprocess("bad.yaml", "-n", "2")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert INVALID_EXPERIMENT.format(count=1) + \
        "\n  bad.yaml:10 faults[0].trigger.at_step: expected an integer, got 'ten'" in out
    assert "Traceback" not in out
    assert not (pytester.path / "reports").exists()


# ---------------------------------------------------------------------------- options


@pytest.mark.parametrize("where", ["pytest.ini", "pyproject.toml", "override"])
def test_a_bad_seed_says_where_it_came_from(pytester: pytest.Pytester, where: str) -> None:
    args: list[str] = []
    if where == "pytest.ini":
        pytester.makefile(".ini", pytest="[pytest]\nfaultlab_seed = x\n")
        source = "[pytest] in pytest.ini"
    elif where == "pyproject.toml":
        pytester.makepyprojecttoml("[tool.pytest.ini_options]\nfaultlab_seed = 'x'\n")
        source = "[tool.pytest.ini_options] in pyproject.toml"
    else:
        args = ["-o", "faultlab_seed=x"]
        source = "-o/--override-ini"
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert BAD_INTEGER.format(setting="faultlab_seed = 'x'", source=source) in \
        result.stderr.str()


def test_the_flag_beats_the_ini_key_and_the_seed_reaches_experiments(
        pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nfaultlab_seed = not-a-number\n")
    pytester.makefile(".yaml", kill=tiny("kill"))
    pytester.makepyfile(test_seed="""
        import yaml
        def test_seed(faultlab):
            exp, source = faultlab.load(yaml.safe_load(open("kill.yaml")))
            assert exp.seed == 7 and source is None
            exp, source = faultlab.load("kill.yaml", seed=9)
            assert exp.seed == 9 and source.name == "kill.yaml"
    """)
    pytester.runpytest_subprocess("--faultlab-seed", "7").assert_outcomes(passed=1)
    result = pytester.runpytest_subprocess("--faultlab-seed=-3")
    assert BAD_INTEGER.format(setting="--faultlab-seed '-3'",
                              source="the command line (--faultlab-seed)") in result.stderr.str()


def test_bad_paths_say_where_they_came_from(pytester: pytest.Pytester) -> None:
    pytester.makefile(".txt", afile="x")
    result = pytester.runpytest_subprocess("--faultlab-report-dir", "afile.txt")
    assert BAD_DIRECTORY.format(
        setting="--faultlab-report-dir 'afile.txt'",
        source="the command line (--faultlab-report-dir)",
        path=pytester.path / "afile.txt") in result.stderr.str()

    pytester.makefile(".ini", pytest="[pytest]\nfaultlab_experiments = nowhere\n")
    result = pytester.runpytest_subprocess()
    assert MISSING_PATH.format(
        setting="faultlab_experiments = 'nowhere'", source="[pytest] in pytest.ini",
        path=pytester.path / "nowhere") in result.stderr.str()


def test_bad_repeat_settings_say_where_they_came_from(pytester: pytest.Pytester) -> None:
    flag = "the command line (--faultlab-repeat)"
    result = pytester.runpytest_subprocess("--faultlab-repeat", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert BAD_REPEAT.format(setting="--faultlab-repeat '0'", source=flag) in \
        result.stderr.str()

    pytester.makefile(".ini", pytest="[pytest]\nfaultlab_repeat = 3\n"
                                     "faultlab_min_pass_rate = 120%\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert BAD_PASS_RATE.format(
        setting="faultlab_min_pass_rate = '120%'", source="[pytest] in pytest.ini",
        problem="'120%' is not a pass rate in (0, 1]; write e.g. 0.95 or 95%, or leave it out "
                "to require every run to pass") in result.stderr.str()

    # the flag beats the ini key: a repeat of 1 leaves the ini's (valid) rate without a set
    pytester.makefile(".ini", pytest="[pytest]\nfaultlab_repeat = 3\n"
                                     "faultlab_min_pass_rate = 0.9\n")
    result = pytester.runpytest_subprocess("--faultlab-repeat", "1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert PASS_RATE_WITHOUT_REPEAT.format(setting="faultlab_min_pass_rate = '0.9'",
                                           source="[pytest] in pytest.ini") in \
        result.stderr.str()


# ---------------------------------------------------------------------- fixture and marker


def test_marker_and_fixture_misuse_fail_with_a_message(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\naddopts = --strict-markers\n")
    pytester.makepyfile(test_misuse="""
        import pytest

        @pytest.mark.faultlab_experiment({"name": "x"})
        def test_unused():
            pass

        def test_no_marker(faultlab_result):
            pass

        @pytest.mark.faultlab_experiment(42)
        def test_wrong_type(faultlab_result):
            pass

        @pytest.mark.faultlab_experiment({"name": "x", "faults": "kill"})
        def test_invalid_dict(faultlab_result):
            pass

        def test_suite_path(faultlab):
            faultlab.run("suite.yaml")
    """)
    pytester.makefile(".yaml", a=tiny("alpha"), b=tiny("beta"),
                      suite="name: both\nsuite: [a.yaml, b.yaml]\n")
    result = pytester.runpytest_subprocess("-rA")
    result.assert_outcomes(failed=1, errors=4)
    out = result.stdout.str()
    assert MARKER_WITHOUT_FIXTURE.format(nodeid="test_misuse.py::test_unused") in out
    assert NO_MARKER.format(nodeid="test_misuse.py::test_no_marker") in out
    assert BAD_MARKER.format(nodeid="test_misuse.py::test_wrong_type", value="42") in out
    assert "test_misuse.py::test_invalid_dict faults:" in out
    assert SUITE_IN_RUN.format(path=pytester.path / "suite.yaml", count=2) in out
    assert not (pytester.path / "reports").exists()


def test_sla_table_shows_bound_measured_result_and_note() -> None:
    from faultlab.engine import SLAResult

    result = SimpleNamespace(
        name="kill", verdict="fail", error=None, journal_path="r/kill/journal.json",
        slas=[SLAResult("completes", True, True, True),
              SLAResult("resume_time_s", 0.001, 3.25, False),
              SLAResult("lost_steps", 10, None, False, "not measured: no events")])
    result.passed = False
    result.failures = lambda: [s for s in result.slas if not s.passed]
    lines = sla_table(result).splitlines()
    assert lines[0] == SLA_FAILED.format(name="kill", failed=2, total=3)
    assert lines[1].split() == ["SLA", "bound", "measured", "result", "note"]
    assert lines[3].split() == ["resume_time_s", "<=", "0.001", "3.250", "FAIL"]
    assert lines[4].split()[:5] == ["lost_steps", "<=", "10", "not", "measured"]
    assert lines[-1] == JOURNAL.format(path="r/kill/journal.json")
    # stopped before the launch (a checkpoint path shared between runs): no table of nothing
    result.slas, result.error = [], "my_job.yaml:5 target.command[7]: ... {run_dir}/ckpt."
    assert sla_table(result).splitlines() == [
        STOPPED_BEFORE_LAUNCH.format(name="kill"), RUN_ERROR.format(error=result.error),
        JOURNAL.format(path="r/kill/journal.json")]


def test_an_inconclusive_run_fails_with_what_could_not_be_measured() -> None:
    """Nothing failed, but bitwise could not be measured: not a pass; the head line says so,
    the row says INCONCLUSIVE, its note what to add."""
    from pytest_faultlab._items import record_properties

    from faultlab.engine import SLAResult

    note = "not measured: two fault-free runs differ from step 2; add matches_golden_within_noise"
    result = SimpleNamespace(
        name="kill", verdict="inconclusive", passed=False, error=None,
        journal_path="r/kill/journal.json",
        slas=[SLAResult("completes", True, True, True),
              SLAResult("bitwise_equal_to_golden", True, None, False, note, inconclusive=True)])
    result.failures = lambda: [s for s in result.slas if s.result == "fail"]
    lines = sla_table(result).splitlines()
    assert lines[0] == INCONCLUSIVE.format(name="kill", names="bitwise_equal_to_golden")
    assert lines[3].split()[:6] == ["bitwise_equal_to_golden", "True", "not", "measured",
                                    "INCONCLUSIVE", "not"]
    assert lines[3].endswith("add matches_golden_within_noise")
    props: list[tuple[str, object]] = []
    result.metrics = SimpleNamespace(to_dict=dict, faults=[])
    record_properties(props, result)
    assert ("faultlab.verdict", "inconclusive") in props
    assert ("faultlab.sla.bitwise_equal_to_golden.result", "inconclusive") in props
    assert ("faultlab.sla.bitwise_equal_to_golden.measured", "not measured") in props


def test_repeat_table_shows_stability_each_sla_over_the_runs_and_why_runs_failed() -> None:
    from faultlab.engine import SLAResult
    from faultlab.judge.repeats import parse_pass_rate, summarize

    def run(resume_s: float) -> SimpleNamespace:
        slas = [SLAResult("completes", True, True, True),
                SLAResult("resume_time_s", 30, resume_s, resume_s <= 30)]
        r = SimpleNamespace(slas=slas, passed=resume_s <= 30, error=None,
                            verdict="pass" if resume_s <= 30 else "fail",
                            run_folder=Path(f"r/kill-{resume_s:g}"))
        r.failures = lambda: [s for s in slas if not s.passed]
        r.journal = {"verdict": "pass" if r.passed else "fail", "metrics": {},
                     "slas": [{"name": s.name, "bound": s.bound, "measured": s.measured,
                               "passed": s.passed} for s in slas]}
        return r

    runs = [run(5.0), run(41.5), run(7.0)]
    outcome = SimpleNamespace(name="kill", results=runs, record_path="r/kill-x3/repeats.json",
                              summary=summarize([r.journal for r in runs],
                                                min_pass_rate=parse_pass_rate("95%")))
    lines = repeat_table(outcome).splitlines()
    assert lines[0] == REPEAT_FAILED.format(
        name="kill", num_runs=3, stability="2/3 passed (67%; required 3, min pass rate 95%)")
    assert lines[1].split() == ["SLA", "bound", "met", "median", "tail", "headroom"]
    assert lines[3].split() == ["resume_time_s", "≤", "30.00", "s", "2/3", "7.00", "s", "p95",
                                "41.50", "s", "-11.50", "s", "(-38%)"]
    assert lines[4] == "failed run kill-41.5: resume_time_s: measured 41.5, required <= 30"
    assert lines[-1] == JOURNAL.format(path="r/kill-x3/repeats.json")


# -------------------------------------------------------------------------------- real runs


MARKED = """
import json
import pytest
import yaml

EXP = yaml.safe_load('''{exp}''')

@pytest.mark.faultlab_experiment(EXP)
def test_marked(faultlab_result, faultlab):
    assert faultlab_result.passed, faultlab.sla_table(faultlab_result)
    assert faultlab_result.metrics.restarts == 1
    assert faultlab_result.metrics.resume_time_s > 0
    journal = json.loads(faultlab_result.journal_path.read_text())
    assert journal["verdict"] == "pass" and journal["faults"][0]["id"] == "kill-rank-0"
    assert faultlab.results == [faultlab_result]
"""


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_real_runs_pass_fail_with_the_sla_table_and_fill_junit(
        pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", slow=tiny("tiny_slow", FAILING),
                      suite="name: one\nsuite: [slow.yaml]\n")
    pytester.makepyfile(test_marked=MARKED.format(exp=tiny("tiny_marked")))
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess("suite.yaml", "test_marked.py",
                                           f"--junitxml={junit}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        SLA_FAILED.format(name="tiny_slow", failed=1, total=4),
        "SLA * bound * measured * result*",
        "completes * True * True * pass",
        "resume_time_s * <= 0.001 * * FAIL",
        "fault_landed_at_step[[]kill-rank-0[]] * 6 * 6 * pass",  # the step gate held
        JOURNAL.format(path=str(pytester.path / "reports") + "/tiny_slow-*/journal.json"),
        "what happened:",
        "  injected kill-rank-0*",
    ])
    assert "Traceback" not in result.stdout.str()

    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    # a YAML item and the fixture record a run's properties with the same function
    props = {p.get("name"): p.get("value") for p in cases["test_marked"].iter("property")}
    assert props["faultlab.verdict"] == "pass"
    assert props["faultlab.sla.lost_steps.bound"] == "5"
    assert props["faultlab.sla.lost_steps.result"] == "pass"
    assert float(props["faultlab.resume_time_s"]) > 0
    assert props["faultlab.restarts"] == "1"
    assert float(props["faultlab.sla.lost_steps.measured"]) <= 5
    assert props["faultlab.journal"].endswith("journal.json")
    slow = {p.get("name"): p.get("value") for p in cases["tiny_slow"].iter("property")}
    assert slow["faultlab.verdict"] == "fail"
    assert slow["faultlab.sla.resume_time_s.result"] == "fail"
    assert float(slow["faultlab.sla.resume_time_s.measured"]) > 0.001
    assert slow["faultlab.journal"].endswith("journal.json")
    assert len(list((pytester.path / "reports").glob("*/journal.json"))) == 2
