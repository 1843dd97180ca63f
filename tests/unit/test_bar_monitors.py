"""``--bar``'s monitor comparison without a job: the bar's experiment for a team's one, the cases
where it cannot be run, and the table's cells read from journals (the real job:
tests/examples/test_examples.py, test_bar_sets_the_teams_monitors_beside_the_bars)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from faultlab.errors import InvalidExperimentError
from faultlab.report.monitors import false_alarms_text, monitor_rows, monitors_markdown
from faultlab.spec import load_experiment
from faultlab.spec.bar import monitor_bar_applies, monitor_bar_experiment

REPO = Path(__file__).resolve().parents[2]
SDC_UPDATE = REPO / "examples/silent_ddp/experiments/sdc_update.yaml"


def _doc(**changes: Any) -> dict[str, Any]:
    doc = yaml.safe_load(SDC_UPDATE.read_text())
    doc.update(changes)
    return doc


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_bar_runs_the_same_faults_on_the_reference_trainer_with_every_rank_a_replica(
        ) -> None:
    team = load_experiment(SDC_UPDATE)
    bar = monitor_bar_experiment(team, SDC_UPDATE)
    assert (bar.target.trainer, bar.target.preset, bar.target.command) == \
        ("reference", "tiny", None)
    assert bar.target.overrides == {"replicate": 3}  # 1 node x 3 ranks: majority attribution
    assert (bar.topology, bar.run.steps, bar.run.timeout_s, bar.seed) == \
        (team.topology, team.run.steps, team.run.timeout_s, team.seed)
    assert bar.faults == team.faults  # the same victims, triggers, magnitudes
    assert (bar.expect.completes, bar.expect.false_alarms, bar.observe.detections) == \
        (True, 0, ())
    assert bar.golden_runs == 1  # its false alarms are counted in a golden run


def test_a_fault_the_reference_trainer_cannot_host_is_refused_where_the_team_wrote_it(
        tmp_path: Path) -> None:
    doc = _doc()
    doc["target"]["services"] = {"watcher": ["python", "-c", "import time; time.sleep(60)"]}
    doc["faults"].append({"id": "watcher-kill", "type": "service_kill", "target": "all",
                          "params": {"service": "watcher"}, "trigger": {"at_step": 8}})
    path = _write(tmp_path, doc)
    team = load_experiment(path)
    with pytest.raises(InvalidExperimentError) as info:
        monitor_bar_experiment(team, path)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1)
                if "service: watcher" in text)
    assert [str(p) for p in info.value.problems] == [
        f"{path}:{line} faults[1].params.service: service_kill: no service 'watcher': the "
        f"experiment runs none: name it under target.services first"]


@pytest.mark.parametrize(("changes", "why"), [
    ({"observe": {}, "expect": {"completes": True}},
     "declares no monitor of the team's (observe.detections)"),
    ({"faults": [{"id": "kill", "type": "rank_kill", "target": {"rank": 1},
                  "trigger": {"at_step": 5}}], "expect": {"completes": True}},
     "injects no fault that corrupts silently or slows the job"),
])
def test_an_experiment_without_monitors_or_a_silent_fault_has_nothing_for_the_bar(
        tmp_path: Path, changes: dict[str, Any], why: str) -> None:
    assert why in str(monitor_bar_applies(load_experiment(_write(tmp_path, _doc(**changes)))))
    assert monitor_bar_applies(load_experiment(SDC_UPDATE)) is None


def test_bar_without_a_launch_line_or_monitors_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from faultlab.cli import main

    exp = REPO / "experiments/rank_kill.yaml"
    code = main(["run", "--bar", "--report-dir", str(tmp_path), str(exp)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    line = next(i for i, text in enumerate(exp.read_text().splitlines(), 1)
                if text.startswith("target:"))  # no launch key: located at target
    assert f"{exp}:{line} target.launch: --bar has nothing to set beside the bar for " \
        f"'rank_kill': it runs under faultlab's own launcher (no target.launch of the " \
        f"team's), and 'rank_kill' runs the reference trainer: its monitors are the bar's " \
        f"own;" in err, err
    assert list(tmp_path.iterdir()) == []


def _journal(signals: list[dict[str, Any]] | None, *, onset: bool = True,
             alarms_counted: bool = True, faults: list[dict[str, Any]] | None = None,
             slas: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    detection = None if signals is None else {
        "onset": {"fault_id": "sdc-update", "step": 5, "ranks": [1], "nodes": ["node0"]}
        if onset else None, "signals": signals}
    counted = [{"name": "false_alarms", "measured": 0, "passed": True}] if alarms_counted else []
    return {"detection": detection, "faults": faults or [], "slas": counted + (slas or [])}


def _signal(name: str, detected: bool, steps: int | None = None, attribution: str | None = None,
            false_alarms: int | None = 0) -> dict[str, Any]:
    return {"name": name, "detected": detected, "within_steps": steps,
            "attribution": attribution, "false_alarms": false_alarms}


def test_the_table_sets_each_team_monitor_beside_each_bar_monitor() -> None:
    team = _journal([_signal("fingerprint", True, 3, "exact"), _signal("spike", False),
                     _signal("replay", True, 0, "none", false_alarms=None)])
    bar = _journal([_signal("anomaly:sdc_suspected", True, 1, "exact"),
                    _signal("anomaly:checkpoint_invalid", True, 2, "wrong", 1)])
    rows, notes = monitor_rows(team, ["fingerprint", "spike", "replay"], bar)
    assert notes == []
    assert rows == [
        ["team", "fingerprint", "yes", "3", "exact", "0"],
        ["team", "spike", "not detected", "—", "—", "0"],
        ["team", "replay", "yes", "0", "none", "not measured"],
        ["bar", "cross-replica fingerprint (anomaly:sdc_suspected)", "yes", "1", "exact", "0"],
        ["bar", "loss spike check (anomaly:loss_spike)", "not detected", "—", "—", "0"],
        ["bar", "grad-norm spike check (anomaly:grad_norm_spike)", "not detected", "—", "—",
         "0"],
        ["bar", "straggler score (anomaly:straggler)", "not detected", "—", "—", "0"],
        ["bar", "anomaly:checkpoint_invalid (anomaly:checkpoint_invalid)", "yes", "2",
         "wrong", "1"],
    ]
    md = monitors_markdown(rows)
    assert md[0] == ("| side | monitor | detected | steps from onset | attribution | "
                     "false alarms |") and md[2] == "| team | fingerprint | yes | 3 | exact | 0 |"


def test_a_bar_that_could_not_run_says_why_in_every_bar_cell() -> None:
    team = _journal([_signal("straggler", True, 4, "exact")])
    why = "the reference trainer cannot run the same faults: exp.yaml:30 faults[1]..."
    rows, notes = monitor_rows(team, ["straggler"], None, why)
    assert rows[0] == ["team", "straggler", "yes", "4", "exact", "0"]
    assert [r[0] for r in rows[1:]] == ["bar"] * 4
    assert all(r[2:] == ["not run (why: below)", "—", "—", "—"] for r in rows[1:])
    assert notes == [f"bar: not run: {why}"]  # said once, under the table


def test_a_fault_that_never_struck_the_bar_is_said_with_its_reason_not_as_a_miss() -> None:
    """An ``activation`` glob that matches none of the reference trainer's modules: the rank
    reports fault_failed, the fault_injected SLA carries it, and every bar cell says so."""
    note = ("it failed in rank 1: sdc surface activation: no module matches '*4' under the "
            "rank's outermost module; the modules it saw: '', 'tok_emb'")
    bar = _journal([], onset=False, slas=[{"name": "fault_injected[sdc-x]", "passed": False,
                                           "note": note}])
    rows, notes = monitor_rows(_journal([_signal("fingerprint", False)]), ["fingerprint"], bar)
    assert rows[0][2] == "not detected"
    assert {r[2] for r in rows[1:]} == {"fault never struck (why: below)"}
    assert notes == [f"bar: fault never struck: fault_injected[sdc-x]: {note}"]
    failed = _journal([], onset=False, faults=[{"id": "slow", "error": "no GPU view"}])
    rows, notes = monitor_rows(failed, ["straggler"], failed)
    assert rows[0][2] == "fault never struck (why: below)"
    assert notes == ["team: fault never struck: slow: no GPU view",
                     "bar: fault never struck: slow: no GPU view"]
    silent = _journal([], onset=False)  # nothing recorded of why: no pointer to a note
    assert monitor_rows(silent, ["x"], silent)[0][0][2] == "fault never struck"


def test_false_alarms_are_never_a_zero_that_was_not_counted() -> None:
    uncounted = _journal([], alarms_counted=False)
    assert false_alarms_text([uncounted], "anomaly:loss_spike") == "not measured"
    assert false_alarms_text([_journal([])], "anomaly:loss_spike") == "0"
    assert false_alarms_text([_journal([])], "spike") == "not measured"  # declared, not scored
    assert false_alarms_text([None], "anomaly:loss_spike") == "not measured"
    assert monitor_rows(_journal(None), ["spike"], None)[0][0][2:] == [
        "not measured (no detection record)", "—", "—", "not measured"]


def test_a_launch_line_the_bar_cannot_run_leaves_the_monitors_to_compare(tmp_path: Path) -> None:
    """An ft_launcher line refuses the launch comparison (tests/unit/test_cli.py), not the
    monitors': with a team's monitor and a slowing fault, --bar goes ahead for those."""
    from faultlab.side_by_side import refuse_bar

    doc = yaml.safe_load((REPO / "examples/nvrx_ft/experiments/rank_kill.yaml").read_text())
    doc["observe"]["detections"] = [{"name": "straggler",
                                     "log_pattern": r"straggler: rank (?P<rank>\d+)"}]
    doc["faults"] = [{"id": "slow", "type": "gpu_slow", "target": {"rank": 1},
                      "params": {"factor": 3.0}, "trigger": {"at_step": 5}, "duration_s": 60}]
    doc["expect"] = {"completes": True}
    path = _write(tmp_path, doc)
    refuse_bar([(path, load_experiment(path))])  # no InvalidExperimentError
    doc["observe"]["detections"] = []
    path = _write(tmp_path, doc)
    with pytest.raises(InvalidExperimentError, match="--bar cannot run 'nvrx_ft_rank_kill'"):
        refuse_bar([(path, load_experiment(path))])
