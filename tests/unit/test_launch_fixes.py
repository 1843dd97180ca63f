"""Every launch finding carries the fix a team pastes, and the fix removes the mechanism the
finding saw (faultlab.observe.launch_fixes); ``--with-fix`` composes them and refuses a run
with nothing to fix before anything starts (the proof on real jobs: tests/examples)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from faultlab.cli import main
from faultlab.observe import FaultRecord
from faultlab.observe.launch_findings import LaunchFinding, abort_at_exit, launch_findings
from faultlab.side_by_side import fixed_target
from faultlab.spec import experiment_from_dict
from faultlab.spec.launch import TORCHRUN_DEFAULT

TRAIN = str(Path(__file__).resolve().parents[2] / "examples/fsdp2_dcp/train.py")
ELASTIC = {"launch": list(TORCHRUN_DEFAULT), "filled": {"nnodes": "1:2"}}
NODE0 = FaultRecord(id="lose-0", type="node_kill",
                    capabilities=("loses_node",), injected_t=10.0, target="node 0")
NODE1 = FaultRecord(id="lose-1", type="node_kill",
                    capabilities=("loses_node",), injected_t=10.0, target="node 1")
STORE_GONE = "RendezvousConnectionError: The connection to the C10d store has failed."
STALE = "RuntimeError: Gloo connectFullMesh failed with ... Connection refused"
CASES = {  # cause → (faults, logs, hung) that make it
    "store_lost": ([NODE0], {"node0": "", "node1": STORE_GONE}, False),
    "slow_rendezvous": ([NODE1], {"node0": "", "node1": ""}, False),
    "stale_worker_store": ([], {"node0": STALE}, False),
    "restart_hung": ([], {"node0": ""}, True),
}


def _one(cause: str, launch: dict[str, object], services: dict[str, list[str]] | None = None
         ) -> list[LaunchFinding]:
    faults, logs, hung = CASES[cause]
    return launch_findings(launch, faults, logs, hung_after_restart=hung,  # type: ignore[arg-type]
                           services=services or {})


@pytest.mark.parametrize("cause", sorted(CASES))
def test_the_fix_loads_as_an_experiment_and_removes_what_the_finding_saw(cause: str) -> None:
    [finding] = _one(cause, ELASTIC)
    assert finding.cause == cause and finding.fix and not finding.no_fix
    pasted = yaml.safe_load(finding.fix)["target"]
    # what a team pastes loads: every placeholder known, no refusal (is_host=false points at a
    # service of its own, not at faultlab's per-launch endpoint)
    exp = experiment_from_dict({"name": "x", "target": {"command": ["python", TRAIN], **pasted},
                                "topology": {"nodes": 2, "min_nodes": 1},
                                "expect": {"completes": True}})
    assert list(exp.target.launch) == pasted["launch"]
    # the same run on the fixed line: the mechanism is gone, and no other finding appears
    after = _one(cause, {**ELASTIC, "launch": pasted["launch"]}, pasted.get("services"))
    assert after == []


def test_the_store_fix_brings_its_store_and_the_rendezvous_settings() -> None:
    [finding] = _one("store_lost", ELASTIC, {"store": ["already", "{store_port}"]})
    pasted = yaml.safe_load(finding.fix)["target"]
    # the name "store" is taken: the new one gets its own, and the endpoint its port
    assert list(pasted["services"]) == ["rdzv_store"]
    assert "{rdzv_store_port}" in pasted["services"]["rdzv_store"][2]
    line = pasted["launch"]
    assert line[line.index("--rdzv-endpoint") + 1] == "127.0.0.1:{rdzv_store_port}"
    assert line[line.index("--rdzv-conf") + 1] == (
        "is_host=false,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3")


def test_a_fix_keeps_the_rest_of_the_line() -> None:
    line = ["env", "NCCL_DEBUG=INFO", *TORCHRUN_DEFAULT, "--rdzv-conf=join_timeout=900"]
    [slow] = _one("slow_rendezvous", {**ELASTIC, "launch": line})
    fixed = yaml.safe_load(slow.fix)["target"]["launch"]
    assert fixed[:2] == ["env", "NCCL_DEBUG=INFO"]
    assert fixed[-1] == ("--rdzv-conf=join_timeout=900,last_call_timeout=1,"
                         "keep_alive_interval=1,keep_alive_max_attempt=3")
    [stale] = _one("stale_worker_store", {**ELASTIC, "launch": line})
    assert yaml.safe_load(stale.fix)["target"]["launch"][:3] == [
        "env", "NCCL_DEBUG=INFO", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"]


def test_where_no_fix_exists_the_finding_says_so() -> None:
    nvrx = ["ft_launcher", *TORCHRUN_DEFAULT[1:], "--rdzv-conf", "last_call_timeout=1"]
    [slow] = _one("slow_rendezvous", {**ELASTIC, "launch": nvrx})
    assert slow.fix == "" and "hard-codes" in slow.no_fix
    [first] = _one("slow_rendezvous", {**ELASTIC, "launch": nvrx[:-2]})
    assert yaml.safe_load(first.fix)["target"]["launch"][-2:] == ["--rdzv-conf",
                                                                  "last_call_timeout=1"]
    killed = FaultRecord(id="k", type="service_kill",
                         capabilities=("kills_service",), injected_t=5.0, target="all",
                         details={"service": "lighthouse"})
    [lost] = launch_findings({**ELASTIC, "filled": {"lighthouse_port": "4242"}}, [killed],
                             {"node0": "connect error to 127.0.0.1:4242"})
    assert lost.cause == "service_lost" and lost.fix == "" and "supervised" in lost.no_fix
    [abort] = abort_at_exit({"node0": "terminate called without an active exception"})
    assert abort.fix == "" and "trainer's code" in abort.no_fix


def _exp(launcher: str = "local"):  # type: ignore[no-untyped-def]
    return experiment_from_dict({
        "name": "x", "target": {"command": ["python", TRAIN], "launch": "torchrun"},
        "topology": {"nodes": 2, "min_nodes": 1, "launcher": launcher},
        "expect": {"completes": True}})


def test_with_fix_applies_every_fix_in_turn_and_says_what_it_left() -> None:
    findings = [f.to_dict() for c in ("store_lost", "stale_worker_store")
                for f in _one(c, ELASTIC)]
    findings += [f.to_dict() for f in abort_at_exit(
        {"node1": "terminate called without an active exception"})]
    target, applied, skipped = fixed_target(_exp(), findings)
    assert applied == ["store_lost", "stale_worker_store"]
    assert target.launch[:3] == ("env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "torchrun")
    assert "is_host=false" in target.launch[target.launch.index("--rdzv-conf") + 1]
    assert list(target.services) == ["store"]
    assert skipped == [f"abort_at_exit: {findings[-1]['no_fix']}"]
    # docker nodes run no target.services: the store fix is left, and why is said
    target, applied, skipped = fixed_target(_exp("docker"), findings[:2])
    assert applied == ["stale_worker_store"] and not target.services
    assert skipped[0].startswith("store_lost: its fix adds a service")


@pytest.mark.parametrize("launch,flags,why", [
    ("faultlab", [], "runs under faultlab's own launcher"),
    ("[python, wrap.py]", [], "the fixes faultlab knows are torchrun's"),
    ("torchrun", ["--repeat", "2"], "--repeat and --with-fix"),
])
def test_with_fix_with_nothing_to_fix_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], launch: str, flags: list[str],
        why: str) -> None:
    exp = tmp_path / "x.yaml"
    exp.write_text(f"name: x\ntarget:\n  command: [python, {TRAIN}]\n"
                   f"  launch: {launch}\n"
                   "topology: {nodes: 1}\nexpect: {completes: true}\n")
    reports = tmp_path / "reports"
    code = main(["run", "--with-fix", *flags, "--report-dir", str(reports), str(exp)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert f"{exp}:4 target.launch: --with-fix has nothing to fix" in err and why in err
    assert "nothing was run." in err and not reports.exists()


def test_a_run_with_no_finding_to_fix_says_so_and_runs_nothing_more(tmp_path: Path) -> None:
    """After the team's run: no finding with a fix (here the trainer's own abort at exit, which
    no launch line fixes), so there is no second run, and fix.md says why."""
    import argparse
    import json
    from types import SimpleNamespace

    from rich.console import Console

    from faultlab.side_by_side import run_with_fix

    folder = tmp_path / "team"
    folder.mkdir()
    abort = abort_at_exit({"node1": "terminate called without an active exception"})[0]
    (folder / "journal.json").write_text(json.dumps({"run": {"launch_findings": [
        abort.to_dict()]}}))
    team = SimpleNamespace(journal_path=folder / "journal.json", run_folder=folder, passed=False)
    console = Console(record=True, width=200)
    run_with_fix(_exp(), folder / "x.yaml", team, argparse.Namespace(report_dir=tmp_path),
                 console, report_dir=tmp_path, golden_cache=None)
    text = (folder / "fix.md").read_text()
    assert "Nothing to fix: abort_at_exit: the fix is in the trainer's code" in text
    assert "--with-fix has nothing to fix" in console.export_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["team"]  # no second run folder
