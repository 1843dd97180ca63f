"""`--repeat N`: the pass-rate verdict, median/p95 per metric, headroom per SLA, the record and
its renderings, and the command line's errors, on synthetic journals (no job)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from faultlab.cli import main
from faultlab.judge.repeats import nearest_rank, parse_pass_rate, summarize
from faultlab.report.journal import write_journal
from faultlab.report.repeats import (
    REPEAT_RECORD,
    read_record,
    render_repeat_markdown,
    spread_rows,
    write_record,
)


def journal(verdict: str = "pass", *, resume_s: float | None = 5.0, goodput: float = 0.5,
            bitwise: bool = True) -> dict[str, Any]:
    """A journal as the engine writes it, reduced to what a repeat summary reads."""
    resume_ok = resume_s is not None and resume_s <= 30
    return {
        "verdict": verdict,
        "slas": [
            {"name": "fault_injected[kill]", "bound": True, "measured": True, "passed": True,
             "note": ""},
            {"name": "resume_time_s", "bound": 30, "measured": resume_s, "passed": resume_ok,
             "note": ""},
            {"name": "goodput", "bound": 0.3, "measured": goodput, "passed": goodput >= 0.3,
             "note": ""},
            {"name": "bitwise_equal_to_golden", "bound": True, "measured": bitwise,
             "passed": bitwise, "note": ""},
        ],
        "metrics": {"completes": True, "restarts": 1, "resume_time_s": resume_s,
                    "goodput": goodput, "world_sizes": [2], "final_digest": "ab" * 32,
                    "faults": []},
    }


# --- the pass-rate bar ------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["0.95", "95%", " 95 % ", "19/20", 0.95, Fraction(19, 20)])
def test_parse_pass_rate_accepts_fractions_and_percentages(text: Any) -> None:
    assert parse_pass_rate(text) == Fraction(19, 20)


@pytest.mark.parametrize("text,says", [
    ("0", "0 would pass a set in which no run passed"), ("0%", "in (0, 1]"),
    ("1.01", "in (0, 1]"), ("150%", "in (0, 1]"), ("-0.5", "in (0, 1]"),
    ("most", "not a pass rate;"), ("nan", "not a pass rate;"), ("", "not a pass rate;"),
    (float("inf"), "not a pass rate;"), (True, "not a pass rate;")])
def test_parse_pass_rate_refuses_with_the_value_and_the_fix(text: Any, says: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_pass_rate(text)
    assert repr(text) in str(e.value) and says in str(e.value)
    assert "0.95" in str(e.value) and "95%" in str(e.value)


def test_every_run_must_pass_by_default() -> None:
    runs = [journal()] * 19 + [journal("fail", resume_s=31.0)]
    summary = summarize(runs)
    assert (summary.num_passed, summary.num_runs, summary.required) == (19, 20, 20)
    assert summary.verdict == "fail"
    assert summary.stability() == "19/20 passed (95%; required 20, every run)"
    assert summarize([journal()] * 20).verdict == "pass"


def test_min_pass_rate_is_compared_exactly() -> None:
    nineteen = [journal()] * 19 + [journal("fail")]
    eighteen = [journal()] * 18 + [journal("fail")] * 2
    rate = parse_pass_rate("95%")
    assert summarize(nineteen, min_pass_rate=rate).verdict == "pass"  # 19/20 == 0.95 exactly
    assert summarize(eighteen, min_pass_rate=rate).verdict == "fail"
    # 0.9 of 3 runs needs all 3: 2/3 is below the bar.
    three = summarize([journal(), journal(), journal("fail")], min_pass_rate=Fraction(9, 10))
    assert (three.required, three.verdict) == (3, "fail")
    assert "min pass rate 90%" in three.stability()


def test_a_vacuous_set_never_passes() -> None:
    assert summarize([], min_pass_rate=Fraction(1, 100)).verdict == "fail"
    interrupted = summarize([journal()] * 3, interrupted=True)
    assert interrupted.verdict == "fail" and interrupted.stability().endswith("interrupted")


def inconclusive() -> dict[str, Any]:
    """A run in which nothing failed but bitwise could not be measured (issue 53)."""
    j = journal("inconclusive")
    j["slas"][3] = {"name": "bitwise_equal_to_golden", "bound": True, "measured": None,
                    "passed": False, "note": "not measured: two fault-free runs differ",
                    "inconclusive": True, "covered_by": None, "result": "inconclusive"}
    return j


def test_an_inconclusive_run_is_not_a_pass_and_can_make_the_set_inconclusive() -> None:
    # every run must pass: 2 passed and 1 inconclusive would pass only if it were a pass
    summary = summarize([journal(), inconclusive(), journal()])
    assert (summary.num_passed, summary.num_inconclusive, summary.verdict) == \
        (2, 1, "inconclusive")
    assert summary.stability() == "2/3 passed, 1 inconclusive (67%; required 3, every run)"
    bitwise = next(s for s in summary.slas if s.name == "bitwise_equal_to_golden")
    assert (bitwise.num_passed, bitwise.num_inconclusive) == (2, 1)
    assert summary.to_dict()["num_inconclusive"] == 1
    # a failed run beside it: it would fail even if the inconclusive one had passed
    assert summarize([journal(), inconclusive(), journal("fail")]).verdict == "fail"
    # the bar met by the runs that passed: the set passes
    assert summarize([journal()] * 19 + [inconclusive()],
                     min_pass_rate=parse_pass_rate("95%")).verdict == "pass"
    assert summarize([inconclusive()] * 3, interrupted=True).verdict == "fail"
    met = [r for r in spread_rows(summary.to_dict())[0] if r[0] == "bitwise_equal_to_golden"]
    assert met[0][2] == "2/3, 1 inconclusive"


def test_report_and_run_exit_3_for_an_inconclusive_set(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from faultlab.cli import EXIT_INCONCLUSIVE

    folder = _set_folder(tmp_path, ["pass", "pass", "pass"])
    path = folder / read_record(folder)["runs"][1]["run_folder"] / "journal.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **{
        k: inconclusive()[k] for k in ("verdict", "slas")}}))
    assert main(["report", str(folder)]) == EXIT_INCONCLUSIVE
    assert "2/3 passed, 1 inconclusive" in capsys.readouterr().out
    md = (folder / "report.md").read_text()
    assert md.startswith("# rank_kill × 3: INCONCLUSIVE")
    assert "| bitwise_equal_to_golden | = yes | 2/3, 1 inconclusive |" in md
    assert "| 2 | INCONCLUSIVE |" in md


# --- median and p95 ---------------------------------------------------------------------------


def test_nearest_rank_is_a_measured_value() -> None:
    values = [float(v) for v in range(20, 0, -1)]  # order does not matter
    assert nearest_rank(values, 0.95) == 19.0
    assert nearest_rank(values, 0.5) == 10.0
    assert nearest_rank([3.0, 1.0, 2.0, 5.0, 4.0], 0.95) == 5.0  # below 20 runs: the max
    assert nearest_rank([7.0], 0.95) == 7.0
    assert nearest_rank([], 0.95) is None


def test_metric_spread_over_the_runs_that_measured_it() -> None:
    resumes = [4.0, 6.0, 5.0, None, 30.5]  # one run never resumed
    summary = summarize([journal("pass" if r and r <= 30 else "fail", resume_s=r)
                         for r in resumes])
    by_name = {m.name: m for m in summary.metrics}
    resume = by_name["resume_time_s"]
    assert (resume.num_measured, resume.median, resume.p95) == (4, 5.5, 30.5)
    assert (resume.min, resume.max) == (4.0, 30.5)
    assert by_name["restarts"].median == 1
    # booleans, digests and lists are not numbers to take a median of
    assert {"completes", "final_digest", "world_sizes", "faults"}.isdisjoint(by_name)


def test_sla_headroom_is_measured_on_the_failing_side() -> None:
    runs = [journal(resume_s=float(r), goodput=g) for r, g in
            zip(range(1, 21), [0.9] * 18 + [0.35, 0.32], strict=True)]
    slas = {s.name: s for s in summarize(runs).slas}
    resume = slas["resume_time_s"]  # upper bound 30: the p95 (19 s) is 11 s inside it
    assert (resume.kind, resume.median, resume.tail, resume.headroom) == ("max", 10.5, 19.0,
                                                                          11.0)
    assert resume.headroom_fraction == pytest.approx(11 / 30)
    goodput = slas["goodput"]  # lower bound 0.3: the p5 is the second-lowest of 20
    assert (goodput.kind, goodput.tail) == ("min", 0.35)
    assert goodput.headroom == pytest.approx(0.05)
    bitwise = slas["bitwise_equal_to_golden"]
    assert (bitwise.kind, bitwise.num_passed, bitwise.num_runs) == ("bool", 20, 20)
    assert bitwise.headroom is None and bitwise.tail is None


def test_an_sla_broken_in_one_run_shows_negative_headroom() -> None:
    runs = [journal(resume_s=5.0)] * 19 + [journal("fail", resume_s=42.0)]
    resume = {s.name: s for s in summarize(runs).slas}["resume_time_s"]
    assert (resume.num_passed, resume.tail, resume.headroom) == (19, 5.0, 25.0)  # p95 of 20
    runs = [journal(resume_s=5.0)] * 3 + [journal("fail", resume_s=42.0)]
    resume = {s.name: s for s in summarize(runs).slas}["resume_time_s"]
    assert (resume.num_passed, resume.tail, resume.headroom) == (3, 42.0, -12.0)


# --- the record and its renderings ------------------------------------------------------------


def _set_folder(tmp_path: Path, verdicts: list[str], rate: str = "1") -> Path:
    """A repeat set's folder with real run folders (journal.json written as the engine does)."""
    folder = tmp_path / "rank_kill-x3-20261124-030000"
    runs, journals = [], []
    for i, verdict in enumerate(verdicts, start=1):
        run = folder / "runs" / f"rank_kill-20261124-03000{i}"
        run.mkdir(parents=True)
        j = {**journal(verdict, resume_s=4.0 + i),
             "faults": [], "experiment": {"name": "rank_kill", "file": "x.yaml", "seed": 0},
             "golden": None, "environment": {"faultlab": "0", "torch": "0", "python": "3",
                                             "platform": "p", "host": "h", "cpu_count": 2},
             "run": {"wall_s": 40.0 + i, "job_dir": str(run / "job")}}
        write_journal(run, j)
        journals.append(j)
        runs.append({"index": i, "run_folder": str(run.relative_to(folder)), "verdict": verdict,
                     "wall_s": 40.0 + i, "error": None})
    summary = summarize(journals, min_pass_rate=parse_pass_rate(rate))
    write_record(folder, {"verdict": summary.verdict,
                          "experiment": {"name": "rank_kill", "file": "experiments/rank_kill.yaml",
                                         "seed": 0, "description": "SIGKILL rank 1"},
                          "started_t": 0.0, "ended_t": 130.0, "wall_s": 130.0,
                          "golden": {"key": "k" * 20, "digest": "ab" * 32}, "runs": runs,
                          "summary": summary.to_dict()})
    return folder


def test_markdown_shows_stability_and_each_sla_beside_its_bound(tmp_path: Path) -> None:
    folder = _set_folder(tmp_path, ["pass", "fail", "pass"], rate="60%")
    md = (folder / "report.md").read_text()
    assert md.startswith("# rank_kill × 3: PASS")
    assert "- verdict stability: 2/3 passed (67%; required 2, min pass rate 60%)" in md
    # resume 5, 6, 7 s against <= 30 s: median 6, p95 (the max of 3) 7, 23 s of headroom
    assert "| resume_time_s | ≤ 30.00 s | 3/3 | 6.00 s | p95 7.00 s | 23.00 s (77%) |" in md
    assert "| goodput | ≥ 0.500 |" not in md  # the bound is the SLA's, not the measurement
    assert "| goodput | ≥ 0.300 | 3/3 | 0.500 | p5 0.500 | 0.200 (67%) |" in md
    assert "| resume_time_s | 3/3 | 6.00 s | 7.00 s | 5.00 s | 7.00 s |" in md
    assert "| 2 | FAIL | 42.00 s |" in md


def test_report_command_recomputes_a_set_from_its_runs(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    folder = _set_folder(tmp_path, ["pass", "pass", "pass"])
    # A run's journal changed after the fact (e.g. re-judged): the set follows its runs.
    path = folder / read_record(folder)["runs"][1]["run_folder"] / "journal.json"
    changed = json.loads(path.read_text())
    changed["verdict"] = "fail"
    path.write_text(json.dumps(changed))
    assert main(["report", str(folder)]) == 1
    assert "2/3 passed" in capsys.readouterr().out
    record = json.loads((folder / REPEAT_RECORD).read_text())
    assert record["verdict"] == "fail" and record["summary"]["verdicts"] == ["pass", "fail",
                                                                              "pass"]
    assert "2/3 passed (67%; required 3, every run)" in (folder / "report.md").read_text()


def test_rows_are_shared_by_terminal_and_markdown(tmp_path: Path) -> None:
    record = read_record(_set_folder(tmp_path, ["pass"] * 3))
    sla_rows, metric_rows = spread_rows(record["summary"])
    assert ["fault_injected[kill]", "= yes", "3/3", "—", "—", "—"] in sla_rows
    md = render_repeat_markdown(record)
    assert all(f"| {row[0]} | {row[1]} | {row[2]} |" in md for row in sla_rows + metric_rows)


# --- the command line -------------------------------------------------------------------------


@pytest.mark.parametrize("args,says", [
    (["--repeat", "0"], "argument --repeat: '0' is not a number of runs >= 1"),
    (["--repeat", "two"], "argument --repeat: 'two' is not a number of runs >= 1"),
    (["--repeat", "3", "--min-pass-rate", "120%"],
     "argument --min-pass-rate: '120%' is not a pass rate in (0, 1]"),
    (["--repeat", "3", "--min-pass-rate", "0"], "0 would pass a set in which no run passed"),
    (["--min-pass-rate", "0.9"], "--min-pass-rate 90% needs --repeat N with N >= 2"),
    (["--repeat", "1", "--min-pass-rate", "95%"], "e.g. --repeat 20 --min-pass-rate 95%"),
])
def test_bad_repeat_flags_exit_2_before_anything_runs(tmp_path: Path, args: list[str],
                                                      says: str,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    with pytest.raises(SystemExit) as e:
        main(["run", "experiments/rank_kill.yaml", "--report-dir", str(tmp_path), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []  # nothing ran, no folder was made
