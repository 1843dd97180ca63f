"""`faultlab sweep`: the path and range of ``--param``, its located errors, the thresholds of
the detection curve (monotone, not, never, everywhere, false alarms) and the files a sweep
writes, on hand-built journals (no job; the real sweep is tests/integration/test_sweep_job.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from faultlab.cli import main
from faultlab.errors import InvalidExperimentError
from faultlab.report.journal import SCHEMA_VERSION
from faultlab.report.sweep import (
    SWEEP_RECORD,
    cell,
    point_record,
    render_sweep_markdown,
    sweep_rows,
    threshold_text,
    thresholds,
    write_sweep,
)
from faultlab.spec.sweep import (
    auto_scale,
    parse_param_path,
    parse_values,
    range_values,
    sweep_points,
)

REPO = Path(__file__).resolve().parents[2]
STRAGGLER = REPO / "experiments" / "gpu_slow_straggler.yaml"


# --- the path and the values --------------------------------------------------------------


@pytest.mark.parametrize("text,parts", [
    ("faults.0.params.factor", ("faults", 0, "params", "factor")),
    ("faults[0].params.factor", ("faults", 0, "params", "factor")),
    ("faults[sdc.1].params.magnitude", ("faults", "[sdc.1]", "params", "magnitude")),
    ("observe.detections[fingerprint].log_pattern",
     ("observe", "detections", "[fingerprint]", "log_pattern")),
    ("run.steps", ("run", "steps"))])
def test_param_path_reads_dots_indices_and_names(text: str, parts: tuple[Any, ...]) -> None:
    assert parse_param_path(text) == parts


@pytest.mark.parametrize("text", ["", "faults..0", "faults.", "[0].x", "0.x", "faults[0]x",
                                  "faults[]"])
def test_param_path_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match="is not a path into the experiment"):
        parse_param_path(text)


def test_log_range_spans_decades_and_linear_range_even_steps() -> None:
    assert range_values(1e-7, 1e-1, points=4, scale="log") == [1e-7, 1e-5, 1e-3, 1e-1]
    assert range_values(1.1, 3.0, points=5, scale="linear") == [1.1, 1.58, 2.05, 2.52, 3.0]
    assert range_values(5, 40, points=4, scale="linear", integers=True) == [5, 17, 28, 40]
    assert range_values(1, 3, points=5, scale="linear", integers=True) == [1, 2, 3]
    # The default: log from a decade up (SDC magnitudes), linear below (slowdowns).
    assert auto_scale(1e-7, 1e-1) == "log" and auto_scale(1.1, 3.0) == "linear"
    assert auto_scale(-1.0, 100.0) == "linear"


@pytest.mark.parametrize("lo,hi,points,scale,says", [
    (3.0, 1.1, 5, "linear", "from a smaller finite number to a larger one"),
    (1.0, float("nan"), 5, "linear", "from a smaller finite number"),
    (1.0, 3.0, 1, "linear", "--points >= 2"),
    (0.0, 1.0, 3, "log", "needs LO > 0")])
def test_range_refuses_with_the_value(lo: float, hi: float, points: int, scale: Any,
                                      says: str) -> None:
    with pytest.raises(ValueError, match=says):
        range_values(lo, hi, points=points, scale=scale)


def test_values_read_as_numbers_first_then_yaml() -> None:
    assert parse_values("1.2, 3,1e-7,true,bitflip") == [1.2, 3, 1e-7, True, "bitflip"]
    with pytest.raises(ValueError, match="empty value"):
        parse_values("1,,2")


# --- the points, each validated as a whole experiment --------------------------------------


def test_points_set_the_value_by_index_or_by_fault_id() -> None:
    for text in ("faults.0.params.factor", "faults[slow-gpu-rank-1].params.factor"):
        points = sweep_points(STRAGGLER, parse_param_path(text), [1.2, 3.0])
        assert [p.experiment.faults[0].params.factor for p in points] == [1.2, 3.0]
        assert [(p.index, p.value) for p in points] == [(1, 1.2), (2, 3.0)]
        assert points[0].experiment.name == "gpu_slow_straggler"


def test_a_fault_without_an_id_is_named_by_its_default_id(tmp_path: Path) -> None:
    text = STRAGGLER.read_text().replace("  - id: slow-gpu-rank-1\n    type:", "  - type:")
    path = tmp_path / "x.yaml"
    path.write_text(text)
    points = sweep_points(path, parse_param_path("faults[gpu_slow-0].trigger.at_step"),
                          [5, 12])
    assert [p.experiment.faults[0].trigger.at_step for p in points] == [5, 12]


def _problems(path: str, values: list[Any], file: Path = STRAGGLER) -> list[str]:
    with pytest.raises(InvalidExperimentError) as e:
        sweep_points(file, parse_param_path(path), values)
    return [str(p) for p in e.value.problems]


def _line(prefix: str) -> int:
    """The line of STRAGGLER that starts with ``prefix`` (its comment may grow: no line
    number is written into these tests)."""
    lines = STRAGGLER.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.startswith(prefix))


@pytest.mark.parametrize("path,where,says", [
    ("fault.0.params.factor", "name:", "the document has no key 'fault'; its keys: name, "),
    ("faults.3.params.factor", "faults:", "faults has no item 3; its items (index [name]):"
                                          " 0 [slow-gpu-rank-1]"),
    ("faults[slow-gpu-rank-2].params.factor", "faults:", "no item named 'slow-gpu-rank-2'"),
    ("faults.0.params", "    params:", "is a mapping, not one value: sweep one of its keys "
                                       "or items (factor)"),
    ("faults.0.params.factor.x", "    params:", "is a value (5.0), not a mapping or list")])
def test_a_path_that_names_nothing_is_located_with_the_valid_keys(path: str, where: str,
                                                                   says: str) -> None:
    (problem,) = _problems(path, [1.2])
    at = {"name:": f":{_line('name:')}:", "faults:": f":{_line('faults:')} faults:",
          "    params:": f":{_line('    params:')} faults[0].params"}[where]
    assert at in problem and f"--param {path}" in problem and says in problem, problem


def test_a_bad_value_says_which_point_and_why() -> None:
    (problem,) = _problems("faults.0.params.factor", [0.5, 2.0, 3.0])
    assert f"gpu_slow_straggler.yaml:{_line('    params:')} faults[0].params.factor" in problem
    assert "at point 1 (faults[0].params.factor=0.5) of the sweep" in problem
    assert "must be > 1" in problem


def test_a_problem_at_every_point_is_said_once() -> None:
    (problem,) = _problems("faults.0.params.factr", [1.2, 3.0])
    assert "at every point of the sweep: unknown key 'factr'; did you mean 'factor'?" in problem


def test_a_suite_or_campaign_is_refused(tmp_path: Path) -> None:
    campaign = REPO / "experiments" / "campaign_reference.yaml"
    (problem,) = _problems("campaign.mtbf_steps", [10], file=campaign)
    assert "runs one experiment; this document is a campaign" in problem


# --- the table and the thresholds, from the journals' detection sections -------------------


ONSET = {"fault_id": "slow-gpu-rank-1", "t": 12.0, "step": 10, "ranks": [1],
         "nodes": ["node1"]}


def signal(name: str, detected: bool, steps: int | None = 3, *, attribution: str = "exact",
           false_alarms: int | None = 0) -> dict[str, Any]:
    """One entry of a journal's detection.signals, as the contract writes it."""
    return {"name": name, "detected": detected, "t": 15.0 if detected else None,
            "step": 10 + steps if detected and steps is not None else None,
            "within_s": 1.5 if detected else None, "within_steps": steps if detected else None,
            "ranks": [1] if detected else None, "nodes": None,
            "attribution": attribution if detected else None, "false_alarms": false_alarms,
            "evidence": "line" if detected else None}


def journal(*signals: dict[str, Any], onset: dict[str, Any] | None = ONSET,
            verdict: str = "pass") -> dict[str, Any]:
    return {"verdict": verdict, "run": {"timed_out": False},
            "detection": {"onset": onset, "signals": list(signals)}}


def points(*journals: dict[str, Any], values: tuple[Any, ...] = (1.2, 1.6, 2.0, 3.0),
           errors: tuple[str | None, ...] = ()) -> list[dict[str, Any]]:
    errs = list(errors) + [None] * (len(journals) - len(errors))
    return [point_record(i + 1, v, j, run_folder=f"runs/p{i + 1}", error=e)
            for i, (v, j, e) in enumerate(zip(values, journals, errs, strict=True))]


def by_signal(pts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["signal"]: t for t in thresholds(pts)}


def test_a_monotone_curve_has_its_threshold_and_says_every_larger_value_noticed() -> None:
    t = by_signal(points(journal(signal("s", False)), journal(signal("s", False)),
                         journal(signal("s", True, 5)), journal(signal("s", True, 2))))["s"]
    assert (t["first_noticed"], t["monotone"], t["missed_above"]) == (2.0, True, [])
    assert threshold_text(t) == ("noticed from 2.0 on, and at every larger value; named "
                                 "exactly the victims wherever it noticed; 0 false alarms in "
                                 "the golden run(s)")


def test_a_non_monotone_curve_is_said_not_hidden() -> None:
    t = by_signal(points(journal(signal("s", False)), journal(signal("s", True)),
                         journal(signal("s", False)), journal(signal("s", True))))["s"]
    assert (t["first_noticed"], t["monotone"], t["missed_above"]) == (1.6, False, [2.0])
    assert threshold_text(t).startswith("first noticed at 1.6, but missed at 2.0 above it: "
                                        "not monotone")


def test_noticing_and_naming_the_victim_are_two_thresholds() -> None:
    # A 1.2x straggler "noticed" by naming another rank is not the fault's victim found.
    t = by_signal(points(journal(signal("s", True, attribution="wrong")),
                         journal(signal("s", True, attribution="exact")),
                         journal(signal("s", True, attribution="extra")),
                         journal(signal("s", True, attribution="exact"))))["s"]
    assert (t["first_noticed"], t["monotone"]) == (1.2, True)
    assert (t["first_attributed"], t["unattributed_above"]) == (1.6, [2.0])
    assert "; named exactly the victims from 1.6, but not at 2.0 above it;" in threshold_text(t)
    named_late = by_signal(points(journal(signal("s", True, attribution="none")),
                                  journal(signal("s", True, attribution="exact")),
                                  values=(1.2, 3.0)))["s"]
    assert "; named exactly the victims from 3.0 on;" in threshold_text(named_late)
    nobody = by_signal(points(journal(signal("s", True, attribution="none")),
                              values=(3.0,)))["s"]
    assert nobody["first_attributed"] is None
    assert "; never named exactly the victims;" in threshold_text(nobody)


def test_never_detected_and_detected_everywhere() -> None:
    pts = points(*(journal(signal("never", False), signal("always", True)) for _ in range(4)))
    t = by_signal(pts)
    assert t["never"]["first_noticed"] is None and not t["never"]["monotone"]
    assert threshold_text(t["never"]).startswith("never noticed;")
    assert t["always"]["everywhere"] and t["always"]["first_noticed"] == 1.2
    assert threshold_text(t["always"]).startswith("noticed at every value measured, from 1.2")


def test_false_alarms_are_carried_and_said() -> None:
    pts = points(*(journal(signal("noisy", True, false_alarms=2),
                           signal("unknown", False, false_alarms=None)) for _ in range(2)),
                 values=(1.2, 3.0))
    t = by_signal(pts)
    assert t["noisy"]["false_alarms"] == 2
    assert "2 false alarm(s) in the golden run(s): it fires without a fault" in \
        threshold_text(t["noisy"])
    assert "false alarms in the golden run(s): not measured" in threshold_text(t["unknown"])
    assert cell(pts[0], "noisy") == "3 steps / 1.50 s, attributed, 2 false alarm(s)"


def test_a_point_that_measured_nothing_is_not_a_miss() -> None:
    # Point 2 could not run, point 3's fault never struck: neither counts as "not detected".
    pts = points(journal(signal("s", True)), {}, journal(signal("s", False), onset=None),
                 journal(signal("s", True)), errors=(None, "golden run failed"))
    t = by_signal(pts)["s"]
    assert (t["first_noticed"], t["monotone"], t["not_measured"]) == (1.2, True, [1.6, 2.0])
    assert "not measured at 1.6, 2.0" in threshold_text(t)
    assert [cell(p, "s") for p in pts] == ["3 steps / 1.50 s, attributed", "could not run",
                                           "fault never struck", "3 steps / 1.50 s, attributed"]


def test_a_trainer_anomaly_absent_from_a_measured_point_did_not_fire() -> None:
    pts = points(journal(signal("fp", False)), journal(signal("fp", False),
                                                       signal("anomaly:straggler", True, 1)),
                 values=(1.2, 3.0))
    t = by_signal(pts)
    assert t["anomaly:straggler"]["first_noticed"] == 3.0
    assert cell(pts[0], "anomaly:straggler") == "not detected"


@pytest.mark.parametrize("attribution,reads", [("exact", "attributed"),
                                               ("extra", "named the victims and others"),
                                               ("wrong", "named others only"),
                                               ("none", "named nobody")])
def test_each_attribution_reads_in_its_cell(attribution: str, reads: str) -> None:
    (p,) = points(journal(signal("s", True, 1, attribution=attribution)), values=(2.0,))
    assert cell(p, "s") == f"1 step / 1.50 s, {reads}"


def test_values_with_no_order_say_where_not_from_where() -> None:
    pts = points(journal(signal("fp", False), signal("replay", True, attribution="none")),
                 journal(signal("fp", False), signal("replay", True)),
                 journal(signal("fp", True), signal("replay", True)),
                 values=("activation", "gradient", "update"))
    t = by_signal(pts)
    assert not t["fp"]["ordered"] and t["fp"]["noticed_at"] == ["update"]
    assert threshold_text(t["fp"]) == ("noticed at 'update'; not at 'activation', 'gradient'; "
                                       "0 false alarms in the golden run(s)")
    assert threshold_text(t["replay"]) == (
        "noticed at 'activation', 'gradient', 'update' (every value measured); named exactly "
        "the victims only at 'gradient', 'update'; 0 false alarms in the golden run(s)")


def test_thresholds_order_by_value_not_by_run_order() -> None:
    pts = points(journal(signal("s", True)), journal(signal("s", False)), values=(3.0, 1.2))
    assert by_signal(pts)["s"]["first_noticed"] == 3.0 and by_signal(pts)["s"]["monotone"]


# --- the files ------------------------------------------------------------------------------


def record(pts: list[dict[str, Any]], scale: str = "linear") -> dict[str, Any]:
    return {"experiment": {"name": "gpu_slow_straggler", "file": "x.yaml", "seed": 0,
                           "description": ""},
            "param": {"path": "faults.0.params.factor", "scale": scale,
                      "values": [p["value"] for p in pts]},
            "started_t": 0.0, "ended_t": 10.0, "wall_s": 10.0, "interrupted": False,
            "num_points": len(pts), "golden": None, "points": pts}


def test_write_sweep_writes_json_markdown_and_a_png(tmp_path: Path) -> None:
    pts = points(journal(signal("s", False)), journal(signal("s", True, 4)),
                 values=(1e-7, 1e-1))
    written = write_sweep(tmp_path, record(pts, scale="log"))
    on_disk = json.loads((tmp_path / SWEEP_RECORD).read_text())
    assert on_disk == written and on_disk["kind"] == "faultlab_sweep"
    assert on_disk["signals"] == ["s"] and on_disk["thresholds"][0]["first_noticed"] == 0.1
    md = (tmp_path / "sweep.md").read_text()
    assert md == render_sweep_markdown(on_disk)
    assert "| faults.0.params.factor | verdict | onset | s |" in md
    assert "| 1e-07 | pass | step 10, ranks [1] | not detected |" in md
    assert "- **s**: noticed from 0.1 on, and at every larger value" in md
    assert "![detection curve](sweep.png)" in md
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_how_far_the_corruption_carried_is_a_column_where_the_experiment_asks() -> None:
    far = [{**journal(signal("s", False)),
            "slas": [{"name": "matches_golden_within_noise", "bound": 10.0, "measured": m}]}
           for m in (0.5, 45.599, 260472.667, None)]
    pts = points(*far)
    header, rows = sweep_rows({**record(pts), "signals": ["s"]})
    assert header[-1] == "from golden (noise units)"
    assert [r[-1] for r in rows] == ["0.5 (bound 10)", "45.6 (bound 10)",
                                     "260,473 (bound 10)", "not measured"]
    plain = record(points(journal(signal("s", False)), values=(1.0,)))
    assert sweep_rows({**plain, "signals": ["s"]})[0][-1] == "s"  # not asked: no column


def test_no_signal_is_said_in_the_files(tmp_path: Path) -> None:
    pts = points({"verdict": "pass", "run": {}}, values=(2.0,))  # a journal without detection
    write_sweep(tmp_path, record(pts))
    md = (tmp_path / "sweep.md").read_text()
    assert "No signal was measured" in md and "- no signal measured" in md
    assert sweep_rows(json.loads((tmp_path / SWEEP_RECORD).read_text()))[1] == [
        ["2.0", "pass", "—"]]


def test_report_rebuilds_a_sweep_from_its_runs_journals(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    folder = tmp_path / "sweep"
    journals = [journal(signal("s", False)), journal(signal("s", True, 2))]
    for i, j in enumerate(journals, 1):
        (folder / "runs" / f"p{i}").mkdir(parents=True)
        (folder / "runs" / f"p{i}" / "journal.json").write_text(json.dumps(
            {"schema_version": SCHEMA_VERSION, **j}))
    write_sweep(folder, record(points({}, {}, values=(1.2, 3.0))))  # before the runs ended
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "noticed from 3.0 on" in out
    assert json.loads((folder / SWEEP_RECORD).read_text())["thresholds"][0]["first_noticed"] \
        == 3.0
    shutil.rmtree(folder / "runs" / "p2")  # a point's folder gone: it measured nothing
    record_now = json.loads((folder / SWEEP_RECORD).read_text())
    record_now["points"][1]["error"] = "could not run"
    (folder / SWEEP_RECORD).write_text(json.dumps(record_now))
    assert main(["report", str(folder)]) == 1


# --- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize("args,says", [
    (["--param", "faults.0.params.factor"], "needs a range PATH=LO..HI"),
    (["--param", "faults.0.params.factor=3..1.1"], "from a smaller finite number"),
    (["--param", "faults.0.params.factor=a..b"], "'a'..'b' is not a range of two numbers"),
    (["--param", "faults.0.params.factor=1..3", "--values", "1,2"], "give one"),
    (["--param", "faults.0.params.factor=1..3", "--points", "1"], "number of points >= 2"),
    (["--param", "faults..0=1..3"], "is not a path into the experiment")])
def test_bad_arguments_exit_2_naming_the_flag(args: list[str], says: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["sweep", str(STRAGGLER), *args, "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_bad_point_exits_2_and_runs_nothing(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sweep", str(STRAGGLER), "--param", "faults.0.params.factor",
                 "--values", "3,0.9", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "at point 2 (faults[0].params.factor=0.9)" in err
    assert "nothing was run" in err and not (tmp_path / "out").exists()
