"""`faultlab run` end to end: a passing experiment, a violated SLA, interruption and clean-up.

Each test runs the real CLI (``faultlab.cli.main``, its exit code and what it prints) against
real torchrun jobs: in a subprocess where the test signals or kills faultlab itself, in the
test's own process where it does not (``run``), which spares a second import of faultlab and
torch, about 2 CPU-s a test. Golden runs are cached in one folder per test session, shared by
the xdist workers (the ``golden_cache`` fixture). A shipped experiment through the CLI is
tests/report/test_prelaunch_run.py (a suite of one); every shipped experiment also runs as a
pytest item (make test).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from faultlab.spec import load_experiment
from faultlab.testing import assert_no_job_processes, stopped_job_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"


def _as_at_a_terminal() -> None:
    """Ctrl-C reaches faultlab as it would at a terminal. A test run started in the background
    of a non-interactive shell (``cmd &``) inherits SIGINT *ignored*, and so would faultlab:
    Python then installs no KeyboardInterrupt handler, as ``nohup`` and background jobs
    expect."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Faultlab:
    """``faultlab`` in a subprocess whose output is collected line by line as it comes."""

    def __init__(self, *args: str | Path) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "faultlab.cli", *map(str, args)], cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
            preexec_fn=_as_at_a_terminal)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never saw {text!r}; output:\n{self.output}")
            time.sleep(0.05)

    def wait(self, timeout_s: float = 600) -> int:
        rc = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return rc


Cli = Callable[..., tuple[int, str]]
"""The ``cli`` fixture (tests/conftest.py): ``faultlab ARGS`` in this process."""


def journal(report_dir: Path) -> dict[str, Any]:
    [path] = report_dir.glob("*/journal.json")
    return json.loads(path.read_text())


def sla(j: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in j["slas"] if s["name"] == name)


def test_hang_with_default_timeouts_is_an_sla_failure_not_a_wait(tmp_path: Path,
                                                                cli: Cli) -> None:
    """faultlab ends the hung job at the experiment's own timeout, not at the 30 minutes of
    gloo's process-group timeout that the trainer would wait for (the bound: half of that,
    whatever the machine's speed; the run itself takes its timeout and a clean-up)."""
    exp = load_experiment(EXPERIMENTS / "rank_hang_default_timeouts.yaml")
    t0 = time.monotonic()
    rc, out = cli("run", EXPERIMENTS / "rank_hang_default_timeouts.yaml",
                  "--report-dir", tmp_path)
    took_s = time.monotonic() - t0
    assert rc == 1, out
    pg_timeout_s = float((exp.target.overrides or {})["pg_timeout_s"])
    assert took_s < pg_timeout_s / 2, \
        f"took {took_s:.0f} s for a {exp.run.timeout_s:g} s experiment timeout"
    assert ("FAIL completes: measured False, required == True (timed out after "
            f"{exp.run.timeout_s:g} s)") in out
    j = journal(tmp_path)
    assert j["verdict"] == "fail" and j["run"]["timed_out"] is True
    assert sla(j, "detection_latency_s")["measured"] is None  # nothing ever noticed
    [fault] = j["faults"]
    assert fault["undone_t"] is not None  # continued during clean-up
    assert_no_job_processes(tmp_path)


VIOLATED = """\
name: violated_sla
seed: 0
target: {trainer: reference, preset: tiny}
topology: {nodes: 1, procs_per_node: 1}
run: {steps: 20, checkpoint_every: 5, timeout_s: 240}
faults:
  - type: rank_kill
    target: {rank: 0}
    trigger: {at_step: 7}
expect:
  completes: true
  detection_latency_s: {cold_starts: 0.25}  # the launcher's respawn, not the new rank's start
  resume_time_s: 0.001
"""


def test_violated_sla_exits_1_naming_sla_bound_and_measurement(tmp_path: Path,
                                                               cli: Cli) -> None:
    """The only rank killed: one SLA that cannot hold, and the detection of a job with no
    survivor, measured from the launcher creating the new worker (it was the restarted rank's
    first record, 5.2 s here and 8.5 s on an H100, before)."""
    exp = tmp_path / "violated.yaml"
    exp.write_text(VIOLATED)
    rc, out = cli("run", exp, "--report-dir", tmp_path / "reports")
    assert rc == 1, out
    j = journal(tmp_path / "reports")
    measured = sla(j, "resume_time_s")["measured"]
    assert measured is not None and measured > 0.001
    assert f"FAIL resume_time_s: measured {measured!r} s (" in out  # and in cold starts
    assert "cold starts), required <= 0.001" in out
    assert sla(j, "completes")["passed"] is True
    detection = sla(j, "detection_latency_s")
    assert detection["passed"], detection
    [per_fault] = j["metrics"]["faults"]
    assert per_fault["detection_source"] == "launcher_respawn", per_fault
    assert detection["note"].endswith("[launcher_respawn]") and "process_spawned (rank 0" in \
        detection["note"]
    [fault] = j["faults"]
    assert (fault["at_step"], fault["landed_after_step"]) == (7, 7)  # the step gate held


NODE_HANG = """\
name: node_hang
seed: 0
target: {trainer: reference, preset: tiny, overrides: {watchdog_s: 5, pg_timeout_s: 60}}
topology: {nodes: 2, procs_per_node: 1}
run: {steps: 40, checkpoint_every: 10, timeout_s: 300}
faults:
  - type: node_hang
    target: {node: 1}
    trigger: {at_step: 15}
    until: reaction
    duration_s: 60
expect:
  completes: true
  bitwise_equal_to_golden: true
  samples_exactly_once: true
  detection_latency_s: {s: 6, cold_starts: 0.25}  # the 5 s watchdog and its 1 s check
"""


def test_frozen_node_is_detected_continued_and_the_job_recovers(tmp_path: Path,
                                                                golden_cache: Path,
                                                                cli: Cli) -> None:
    exp = tmp_path / "node_hang.yaml"
    exp.write_text(NODE_HANG)
    rc, out = cli("run", exp, "--report-dir", tmp_path / "reports",
                  "--golden-cache", golden_cache)
    assert rc == 0, out
    j = journal(tmp_path / "reports")
    assert j["schema_version"] == 1 and j["verdict"] == "pass"
    assert all(s["passed"] for s in j["slas"])
    [fault] = j["faults"]
    assert fault["injected_t"] > 0 and fault["error"] is None
    assert fault["details"]["node"] == "node1" and len(fault["details"]["pids"]) >= 2
    assert sorted(fault["details"]["undo"]["continued"]) == sorted(fault["details"]["pids"])
    assert fault["undone_t"] - fault["injected_t"] < 60  # continued once the job reacted
    assert (fault["at_step"], fault["landed_after_step"]) == (15, 15)  # the step gate held
    assert "# node_hang: PASS" in next((tmp_path / "reports").glob("*/report.md")).read_text()
    assert_no_job_processes(tmp_path)


def test_invalid_experiment_exits_2_and_launches_nothing(tmp_path: Path, cli: Cli) -> None:
    exp = tmp_path / "bad.yaml"
    exp.write_text(VIOLATED.replace("trigger: {at_step: 7}", "trigger: {at_step: ten}"))
    rc, out = cli("run", exp, "--report-dir", tmp_path / "reports")
    assert rc == 2, out
    assert f"{exp}:9 faults[0].trigger.at_step" in out and "'ten'" in out
    assert not (tmp_path / "reports").exists()


def frozen_alone(tmp_path: Path) -> Path:
    """rank_hang_default_timeouts.yaml on one node of one rank, its only rank frozen after step
    3: a job that will never go on by itself, for the tests that stop faultlab in the middle of
    it. What they assert (the stopped rank continued, no process of the job left, the journal)
    needs a stopped process, not a peer waiting for it: the shipped two-node job, with its rank
    blocked in a collective, is the timeout test above."""
    text = (EXPERIMENTS / "rank_hang_default_timeouts.yaml").read_text()
    exp = tmp_path / "frozen_alone.yaml"
    exp.write_text(text.replace("  nodes: 2\n", "  nodes: 1\n").replace(
        "    target: {rank: 1}\n", "    target: {rank: 0}\n").replace(
        "  - id: freeze-rank-1\n", "  - id: freeze-rank-0\n"))
    frozen = load_experiment(exp)
    assert frozen.topology.nodes == 1
    assert (frozen.faults[0].target.kind, frozen.faults[0].target.value) == ("rank", 0)
    return exp


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_run_leaves_no_process_and_none_stopped(sig: int, tmp_path: Path) -> None:
    fl = Faultlab("run", frozen_alone(tmp_path), "--report-dir", tmp_path / "reports")
    fl.wait_for("injected freeze-rank-0")
    assert stopped_job_processes(tmp_path), "the hang fault should have stopped a rank"
    fl.proc.send_signal(sig)
    assert fl.wait(timeout_s=60) == 130, fl.output
    assert "interrupted" in fl.output
    assert_no_job_processes(tmp_path)
    j = journal(tmp_path / "reports")
    assert j["run"]["interrupted"] is True and j["verdict"] == "fail"
    assert j["faults"][0]["undone_t"] is not None


def test_killed_faultlab_is_cleaned_up_by_its_guard(tmp_path: Path) -> None:
    fl = Faultlab("run", frozen_alone(tmp_path), "--report-dir", tmp_path / "reports")
    fl.wait_for("injected freeze-rank-0")
    time.sleep(1.0)  # the guard's pid file is refreshed every 0.5 s
    fl.proc.kill()  # no clean-up code of faultlab's can run
    fl.wait(timeout_s=30)
    assert_no_job_processes(tmp_path)


IGNORES_NOTICE = """\
name: spot_ignored
target:
  command: [{python}, -c, "import time; time.sleep(300)"]
topology: {{nodes: 2, procs_per_node: 1, min_nodes: 1}}
run: {{timeout_s: 14}}
faults:
  - type: spot_preemption
    target: {{node: 1}}
    trigger: {{at_time_s: 3}}
    params: {{provider: azure, notice_s: 2}}
"""


def test_a_node_that_ignores_its_spot_notice_is_terminated_at_the_deadline(
        tmp_path: Path, cli: Cli) -> None:
    exp = tmp_path / "spot_ignored.yaml"
    exp.write_text(IGNORES_NOTICE.format(python=json.dumps(sys.executable)))
    reports = tmp_path / "reports"
    _rc, out = cli("run", exp, "--report-dir", reports)
    j = journal(reports)
    [fault] = j["faults"]
    d = fault["details"]
    assert fault["error"] is None, out
    assert d["deadline_t"] - fault["injected_t"] == pytest.approx(2.0, abs=0.1)
    outcome = d["release"]["node1"]
    assert outcome["was_running"] is True and outcome["killed_pids"], out
    assert outcome["terminated_t"] >= d["deadline_t"]
    assert outcome["terminated_t"] - d["deadline_t"] < 1.0
    assert j["run"]["exit_codes"]["node1"] == -signal.SIGKILL
    # a job that does not poll sent no request; nothing of it is left
    assert d["release"]["metadata"]["node1"]["num_requests"] == 0
    assert_no_job_processes(reports)



def test_repeat_runs_independent_jobs_that_share_one_golden_run_over_the_file_channel(
        tmp_path: Path, golden_cache: Path, cli: Cli) -> None:
    """What unit tests of the summary cannot show: N real jobs, each in its own run and job
    folder, and the golden run computed at most once for all of them. It is also where the
    shipped rank_kill.yaml must pass (``make test`` runs no item of it: this runs it twice),
    with one line added: ``run.control_channel: file``, for clusters whose nodes reach the
    submit host only through the shared filesystem (one batched events file per node relay,
    read by faultlab, and the step gate through ``runtime/gates.txt``), whose verdict must be
    the socket channel's. The socket channel runs the same job in the Chaos Toolkit test and
    every other experiment; the golden run is the one they share."""
    text = (EXPERIMENTS / "rank_kill.yaml").read_text()
    exp = tmp_path / "rank_kill.yaml"
    exp.write_text(text.replace("  timeout_s: 300\n",
                                "  timeout_s: 300\n  control_channel: file\n"))
    rc, out = cli("run", exp, "--repeat", "2",
                  "--report-dir", tmp_path / "reports", "--golden-cache", golden_cache)
    assert rc == 0, out
    [folder] = (tmp_path / "reports").glob("rank_kill-x2-*")
    record = json.loads((folder / "repeats.json").read_text())
    assert record["verdict"] == "pass" and record["summary"]["verdicts"] == ["pass", "pass"]
    journals = [json.loads((folder / r["run_folder"] / "journal.json").read_text())
                for r in record["runs"]]
    assert len({j["run"]["job_dir"] for j in journals}) == 2
    assert all(j["metrics"]["restarts"] == 1 for j in journals)  # each job was killed itself
    # one golden key; the second run found it cached (the first computed it or found it)
    assert len({j["golden"]["key"] for j in journals}) == 1
    assert journals[1]["golden"]["cached"] is True
    assert "rank_kill: PASS  2/2 passed (100%; required 2, every run)" in out
    assert "resume_time_s" in out and "p95" in out
    for j in journals:
        plane = j["run"]["control_plane"]
        assert plane == {"channel": "file"}, plane  # no hub, no connection
        [fault] = j["faults"]
        assert (fault["at_step"], fault["landed_after_step"]) == (15, 15)  # the gate held
        job_dir = Path(j["run"]["job_dir"])
        events = sorted(p.name for p in (job_dir / "events").iterdir())
        assert events == ["node0-relay.jsonl", "node1-relay.jsonl"], events
        assert (job_dir / "runtime" / "gates.txt").read_text() == "15\n"
    assert_no_job_processes(tmp_path)
