"""The slurm target against a real Slurm 22.05 (the local test cluster, scripts/slurm-cluster.sh):
the shipped Slurm experiments pass, a job submitted by hand is attached to by job id and broken,
and killing ``faultlab run`` midway leaves nothing behind. The golden reference is found on the
cluster by every way of running and keyed by what its nodes report, ``faultlab validate``
refuses what the cluster says cannot run, and ``completes`` sees each node's exit code. After
every test: no job of the test queued or running, no node down or drained, no process of a job
on any node.

Needs root and a Docker engine: without them it skips with the reason, and under
``FAULTLAB_REQUIRE_DOCKER=1`` (``make test`` in CI) it fails. Its tests share one cluster, so
they run one at a time, on one xdist worker (``tests/conftest.py``); the cluster goes down at
the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultlab.engine import run_experiment
from faultlab.faults import Victim
from faultlab.faults.process import NodeHangFault, RankHangFault, RankKillFault
from faultlab.spec import load_experiment
from faultlab.targets.slurm import SlurmTarget
from faultlab.targets.slurm.slurmcli import TERMINAL, show_job
from tests.slurm.conftest import _assert_nothing_left, _slurm, cluster_up

# one cluster for every test here: tests/conftest.py sends them all to one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in (REPO / "experiments").glob("slurm_*.yaml")
                 if p.name != "slurm_preemption.yaml")
"""The shipped Slurm experiments run here. slurm_preemption runs once, on the NFS cluster
(tests/slurm/test_slurm_nfs.py), where it asks the most, with these assertions too."""


@pytest.fixture(scope="module")
def cluster(slurm_host: None) -> Iterator[Path]:
    with cluster_up() as shared:
        yield shared


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_a_shipped_slurm_experiment_passes(path: Path, cluster: Path, tmp_path: Path,
                                           golden_cache: Path) -> None:
    result = run_experiment(load_experiment(path), source=path, report_dir=tmp_path,
                            golden_cache=golden_cache)
    journal = json.loads(result.journal_path.read_text())
    view = journal["run"]["slurm"]
    m = result.metrics
    print(f"{path.stem}: {result.verdict}; queue {m.queue_time_s} s, requeues {m.requeues}, "
          f"requeue latency {m.requeue_latency_s} s, resume {m.resume_time_s} s, "
          f"lost steps {m.lost_steps}, wall {journal['run']['wall_s']:.1f} s")
    assert result.passed, [str(s) for s in result.failures()] + [result.error or ""]
    # A fault triggered at_step N lands after step N and before step N + 1, on Slurm too (a
    # machine killed, a preemption signal): the ranks wait at the step gate until it is in.
    landed = [(f["id"], f["at_step"], f["landed_after_step"]) for f in journal["faults"]]
    assert landed and all(at == after for _id, at, after in landed), landed
    # Slurm's notice reached every rank, and their records the engine, within the wait (the
    # relays ignore it: one killed by it lost them all, under load for good)
    for fault in journal["faults"]:
        if fault["type"] == "slurm_preempt":
            assert fault["details"]["notice_missing"] == [], fault["details"]
    assert view["final_state"] == "COMPLETED", view
    # The reference was computed on the cluster: the same batch job without faults, through
    # sbatch (the team's own script for slurm_rank_kill, which needs its allocation to start).
    where = journal["golden"]["where"]
    assert where["target"] == "slurm" and isinstance(where.get("slurm_job_id"), int), where
    requeued = path.stem != "slurm_rank_kill"  # a rank kill is recovered inside the allocation
    assert (view["restarts"] >= 1) == requeued, view
    _assert_nothing_left([view["job_id"]])


def _wait_ended(job_id: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (job := show_job(job_id)) is not None and job["JobState"] not in TERMINAL:
        assert time.monotonic() < deadline, job
        time.sleep(0.3)


def _hand_script(shared: Path, run_dir: Path, steps: int = 30) -> Path:
    """A team's own sbatch script: plain torchrun on every node, the reference trainer, no
    faultlab anywhere but the run directory its events go to."""
    script = shared / f"hand-{run_dir.name}.sbatch"  # one per job: tests may run in parallel
    script.write_text(f"""#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=1
#SBATCH -o {run_dir}/hand-%j.out
#SBATCH -D {run_dir}
export FAULTLAB_RUN_DIR={run_dir} OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
# Without this, torch 2.13's restarted workers disagree on MASTER_PORT (the store torchrun's
# agent shares with them) and the restart fails: "Gloo connectFullMesh failed ... Connection
# refused", both restarts used up, the job FAILED. faultlab found that in this very script.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
srun --kill-on-bad-exit=0 {sys.executable} -m torch.distributed.run --nnodes=2 \\
  --nproc-per-node=1 --max-restarts=2 --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29611 \\
  --rdzv-id=hand-$SLURM_JOB_ID -m reference_trainer.train --preset tiny --steps {steps} \\
  --checkpoint-every 10 --min-step-time-s 0.2 --run-dir {run_dir}
""")
    return script


PHASE_COLD_STARTS = 4
"""How long each later phase of the attached job's test may take, in the job's own cold starts
(its submission to its fifth step, measured by the test): a restart takes one at most."""


def test_a_job_submitted_by_hand_is_attached_by_id_and_a_rank_killed(cluster: Path) -> None:
    # The job never ends by itself (a million steps): the test cancels it. With 30 steps, and
    # later 200, CI runs under load saw it complete before the test's last look at it, while
    # the test still expected it RUNNING: a race between the job's steps and the test's phases.
    run_dir = cluster / "runs" / f"hand-{os.getpid()}-{time.time_ns()}"
    (run_dir / "events").mkdir(parents=True)
    submitted = time.monotonic()
    job_id = int(_slurm("sbatch", "--parsable",
                        str(_hand_script(cluster, run_dir, steps=1_000_000))).strip())
    try:
        target = SlurmTarget.attach(job_id)  # its events: the job's WorkDir
        assert target.run_dir == run_dir
        while target.stream.max_step() < 5:  # bounded by the module's timeout
            assert not target.finished(), target.log_tail()
            time.sleep(0.3)
            target.refresh()
        # Each later phase is bounded by the job's own start-up, measured here: never by one
        # machine's clock (a fixed 120 s failed on a machine half as fast).
        phase_s = PHASE_COLD_STARTS * (time.monotonic() - submitted)
        deadline = time.monotonic() + phase_s
        before = target.rank_pid(1)
        details = RankKillFault(RankKillFault.Params()).inject(target, Victim("rank", 1))
        assert details["pids_by_rank"] == {1: before}, details
        # torchrun restarts the group inside the allocation: a new rank 1 process
        while (start := target.stream.latest_start(1)) is None or int(start["pid"]) == before \
                or target.stream.max_step() < 12:
            assert time.monotonic() < deadline, target.log_tail()
            time.sleep(0.3)
            target.refresh()
        assert target.stream.latest_start(1)["resumed_from_step"] >= 0
        deadline = time.monotonic() + phase_s
        # a hang (SIGSTOP) of a rank and of a whole node, each undone (SIGCONT) on the node
        for fault, victim in ((RankHangFault(RankHangFault.Params()), Victim("rank", 0)),
                              (NodeHangFault(NodeHangFault.Params()), Victim("node", 1))):
            node = target.node_of_rank(0) if victim.kind == "rank" else target.node_names()[1]
            hung = fault.inject(target, victim)
            states = target.on_node(node, "pids")["states"]
            assert hung["pids"] and all(states[str(p)] == "T" for p in hung["pids"]), states
            assert fault.undo(target)["continued"] == hung["pids"][::-1]  # the agent last
            states = target.on_node(node, "pids")["states"]
            assert all(states.get(str(p)) != "T" for p in hung["pids"]), states
        step = target.stream.max_step()
        while target.stream.max_step() <= step:  # it trains on after the hangs
            assert time.monotonic() < deadline, target.log_tail()
            time.sleep(0.3)
            target.refresh()
        assert target.state() == "RUNNING"
        assert target.scheduler_view()["attached"] is True
        target.stop()  # not faultlab's job: it goes on
        assert target.state() == "RUNNING"
    finally:
        subprocess.run(["scancel", str(job_id)], check=False, timeout=30)
    _wait_ended(job_id)
    _assert_nothing_left([job_id])


def test_chaos_toolkit_downs_a_node_of_a_running_slurm_job_and_it_is_back_within_its_sla(
        cluster: Path, tmp_path: Path) -> None:
    """The shipped Chaos Toolkit experiment, through the real ``chaos run``, attached by job id
    to a job submitted by hand: its node is set down, Slurm requeues the job, and it is back
    within the SLA; the node is returned to service and the job is left to finish."""
    run_dir = cluster / "runs" / f"chaos-{os.getpid()}-{time.time_ns()}"
    (run_dir / "events").mkdir(parents=True)
    job_id = int(_slurm("sbatch", "--parsable", str(_hand_script(cluster, run_dir))).strip())
    journal_path = tmp_path / "journal.json"
    try:
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "chaos"), "--no-version-check", "--no-log-file",
             "run", "--journal-path", str(journal_path),
             str(REPO / "experiments" / "chaostoolkit" / "slurm_node_down.json")],
            cwd=tmp_path, capture_output=True, text=True, timeout=360,
            env={**os.environ, "FAULTLAB_SLURM_JOB_ID": str(job_id), "PYTHONUNBUFFERED": "1"})
        out = proc.stdout + proc.stderr
        assert journal_path.exists(), out
        journal = json.loads(journal_path.read_text())
        assert journal["status"] == "completed" and journal["deviated"] is False, out
        ran = {r["activity"]["name"]: r.get("output") for r in journal["run"]}
        assert ran["down-node-1"]["details"]["node"] == "node2", ran
        assert ran["job-completes"] is True, out
        job = show_job(job_id)
        assert job is not None and int(job["Restarts"]) == 1, job  # Slurm requeued it once
    finally:
        subprocess.run(["scancel", str(job_id)], check=False, timeout=30)
    _wait_ended(job_id)
    _assert_nothing_left([job_id])


def test_killing_faultlab_midway_leaves_no_job_no_down_node_and_no_process(
        cluster: Path, tmp_path: Path, golden_cache: Path) -> None:
    """``faultlab run`` is SIGKILLed while a node is down and the job is being requeued: the
    guard cancels the job and returns the node to service."""
    exp = tmp_path / "down.yaml"
    exp.write_text((REPO / "experiments" / "slurm_node_down.yaml").read_text()
                   .replace("  bitwise_equal_to_golden: true\n", "")
                   .replace("duration_s: 30", "duration_s: 300"))
    proc = subprocess.Popen([sys.executable, "-m", "faultlab.cli", "run", str(exp),
                             "--report-dir", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = []
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        if "injected node-down" in line:
            break
    else:
        pytest.fail("the fault never fired:\n" + "".join(out))
    # What the engine keeps for the guard: the launcher and SlurmTarget.guard_record, written
    # before the node went down (guard_now), not at the engine's next tick.
    [kept] = tmp_path.glob("slurm_node_down-*/.job-pids-target-guard.json")
    doc = json.loads(kept.read_text())
    guard = doc["record"]
    assert doc["launcher"] == "slurm" and guard["nodes_down"], doc
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    _wait_ended(guard["job_id"])
    _assert_nothing_left([guard["job_id"]])


def test_disk_full_reaches_the_ranks_on_the_nodes_through_the_shared_directory(
        cluster: Path, tmp_path: Path) -> None:
    """The storage faults' passthrough is mounted on the host under the shared directory; the
    cluster binds that directory ``rslave`` into the nodes, so the ranks there write through
    it: ``disk_full`` fails their save with ENOSPC (reported by the reference trainer, which
    goes on), and after the run no node keeps a mount. The fault ends at the ranks' report
    (``until: reaction``): held its whole 5 s, it outlived the remaining steps (0.13 s each
    here), failed the mandatory final save too, and the job restarted, two more rank starts
    (about 6 CPU-s) that this test does not look at."""
    exp = tmp_path / "full.yaml"
    exp.write_text("""\
name: slurm_disk_full
seed: 0
target: {trainer: reference, preset: tiny}
topology: {nodes: 2, launcher: slurm, slurm: {time_limit: "10:00"}}
run: {steps: 16, checkpoint_every: 5, timeout_s: 240}
faults:
  - {id: full, type: disk_full, target: all, trigger: {at_step: 7}, duration_s: 5,
     until: reaction,
     params: {free_bytes: 0}}
expect: {completes: true}
""")
    result = run_experiment(load_experiment(exp), source=exp, report_dir=tmp_path)
    journal = json.loads(result.journal_path.read_text())
    assert result.passed, [str(s) for s in result.failures()] + [result.error or ""]
    [fault] = journal["faults"]
    assert fault["details"]["undo"]["ops_hit"].get("write", 0) >= 1, fault
    from faultlab.runtime.events import read_events

    # The reference trainer reports the failed save (every rank's error, agreed by all) and
    # trains on: the ENOSPC the ranks on the nodes met is in that report.
    failed = [e for e in read_events(Path(journal["run"]["job_dir"]) / "events")
              if e.get("kind") == "anomaly" and e.get("what") == "checkpoint_save_failed"]
    # (torch.save's C++ writer can lose the errno: "unexpected pos" is its ENOSPC)
    assert failed and all("ENOSPC" in e["errno"] or any(
        "unexpected pos" in err for err in e["errors"].values()) for e in failed), failed
    assert not journal["run"]["storage_mount"]["undo"][-1].startswith("could not"), journal
    for node in ("node1", "node2", "node3"):
        mounts = subprocess.run(["docker", "exec", node, "cat", "/proc/mounts"],
                                capture_output=True, text=True, timeout=30, check=True).stdout
        assert "fuse.faultlab" not in mounts, f"{node}:\n{mounts}"
    _assert_nothing_left([journal["run"]["slurm"]["job_id"]])


# -- one golden cache for every way of running, keyed by what the nodes report (issue 53) ------

SHARED_JOB = """\
name: slurm_shared_golden
seed: 3
target: {trainer: reference, preset: tiny}
topology: {nodes: 1, launcher: slurm, slurm: {run_dir: RUN_DIR, time_limit: "10:00"}}
run: {steps: 12, checkpoint_every: 4, timeout_s: 240}
"""
"""One node, 12 steps: what is shared is the reference; each job costs little."""


def test_a_campaign_and_a_repeat_reuse_the_reference_a_plain_run_computed_on_the_cluster(
        cluster: Path, tmp_path: Path) -> None:
    """No golden cache is named, as a user running ``faultlab run``, a campaign, ``--repeat``
    would: each finds the reference where the plain run left it, on the cluster's shared
    filesystem. Its key carries the site the nodes reported (one ``srun`` probe on a node, then
    the golden run's rank 0), and each node's exit code is its own."""
    from faultlab.engine.campaign import run_campaign
    from faultlab.engine.repeat import run_repeated
    from faultlab.runtime.site import COMPARED
    from faultlab.spec import load_campaign
    from faultlab.targets.slurm import site as slurm_site

    runs = cluster / "runs" / f"golden-{os.getpid()}-{time.time_ns()}"  # a fresh cache
    job = SHARED_JOB.replace("RUN_DIR", str(runs))
    plain = tmp_path / "plain.yaml"
    # false_alarms: it counts the reference's alarms as a campaign's score does (its false
    # positives), so the two share one reference made with the same monitor settings
    plain.write_text(job + "expect: {completes: true, bitwise_equal_to_golden: true, "
                           "false_alarms: 0}\n")
    exp = load_experiment(plain)
    first = run_experiment(exp, source=plain, report_dir=tmp_path / "plain")
    assert first.passed, [str(s) for s in first.failures()] + [first.error or ""]
    assert first.golden is not None and not first.golden.cached
    assert (runs / ".golden" / f"{first.golden.key}.json").is_file()  # on the cluster's disk
    # the key carries what the nodes reported: the probe ran on a node of the cluster, and the
    # golden run's rank 0 reported the same site from its node
    probed = slurm_site.known(exp, slurm_site.cluster_name())
    assert probed is not None and probed["shared"] is True, probed
    assert re.fullmatch(r"probe on node\d \(srun\)", probed["source"]), probed
    where = first.golden.where
    assert {k: where[k] for k in COMPARED} == probed["site"] == \
        {k: first.golden.site[k] for k in COMPARED}, (where, probed, first.golden.site)
    assert where["cluster"] == "faultlab" and first.golden.site["world_size"] == 1
    # each node's own exit code (srun's report in the batch output), not the job's one code
    journal = json.loads(first.journal_path.read_text())
    codes = journal["run"]["exit_codes"]
    assert sorted(codes) == hostnames_of(journal) and set(codes.values()) == {0}, codes

    campaign = tmp_path / "campaign.yaml"
    # seed 3: one arrival, a rank_kill of rank 0 after step 5 (faultlab run --dry-run shows it)
    campaign.write_text(job.replace("slurm_shared_golden", "slurm_shared_golden_campaign") +
                        "campaign:\n  mtbf_steps: 4\n  start_after_step: 4\n  until_step: 8\n"
                        "  mix:\n    - {type: rank_kill, weight: 1, params: {signal: KILL}}\n"
                        "expect: {completes: true}\n")
    entry = (runs / ".golden" / f"{first.golden.key}.json").read_text()
    doc, line = load_campaign(campaign)  # type: ignore[misc]
    ran = run_campaign(doc, source=campaign, line=line, report_dir=tmp_path / "campaign")
    scored = json.loads(ran.result.journal_path.read_text())["campaign"]
    assert scored["golden_key"] == first.golden.key and scored["golden_cached"] is True, scored
    assert ran.result.error is None, ran.result.error

    repeated = run_repeated(exp, 1, source=plain, report_dir=tmp_path / "repeat")
    [again] = repeated.results
    assert again.golden is not None and again.golden.cached and \
        again.golden.key == first.golden.key, again.golden
    assert again.passed, [str(s) for s in again.failures()]
    # the plain run's golden job is the reference of all three: no other was computed
    assert (runs / ".golden" / f"{first.golden.key}.json").read_text() == entry
    _assert_nothing_left([json.loads(r.journal_path.read_text())["run"]["slurm"]["job_id"]
                          for r in (first, ran.result, again)])


def hostnames_of(journal: dict) -> list[str]:
    return _slurm("scontrol", "show", "hostnames",
                  journal["run"]["slurm"]["states"][-1]["nodes"]).split()


def test_validate_refuses_what_the_cluster_says_cannot_run(cluster: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """Located at the field to change: a partition the cluster does not have, more nodes than
    its partition holds, and a run directory its nodes do not see (one ``srun`` probe, whose
    answer ``faultlab validate`` then reads)."""
    from faultlab.cli import main as cli_main
    from faultlab.targets.slurm import site as slurm_site

    def refused(text: str) -> str:
        path = tmp_path / f"e{time.time_ns()}.yaml"
        path.write_text(text)
        assert cli_main(["validate", str(path)]) == 2
        return f"{path}:" + " ".join(capsys.readouterr().err.split())

    job = SHARED_JOB.replace("RUN_DIR", str(cluster / "runs"))
    err = refused(job.replace("time_limit", "partition: gpu, time_limit"))
    assert "topology.slurm.partition: 'gpu' is not a partition of cluster 'faultlab'; its " \
           "partitions: debug" in err, err
    err = refused(job.replace("nodes: 1", "nodes: 4"))
    assert ":4 topology.nodes: 4 nodes, but partition 'debug' of cluster 'faultlab' has 3" \
        in err, err
    unshared = Path(f"/var/lib/faultlab-unshared-{os.getpid()}")  # the host's own, no node's
    try:
        text = job.replace(str(cluster / "runs"), str(unshared)) + \
            "expect: {bitwise_equal_to_golden: true}\n"
        path = tmp_path / "unshared.yaml"
        path.write_text(text)
        with pytest.raises(slurm_site.NotShared, match=r"probe on node\d \(srun\)"):
            slurm_site.probe(load_experiment(path), slurm_site.cluster_name())
        err = refused(text)
        assert f":4 topology.slurm.run_dir: the nodes do not see '{unshared}'" in err, err
    finally:
        subprocess.run(["rm", "-rf", str(unshared)], check=False)


NODE_SCRIPT = """\
#!/bin/bash
# One node of a team's job: plain torchrun, then the team's epilogue, which fails on the job's
# first node (an upload, a clean-up): that node exits 3 after training completed everywhere.
"$FAULTLAB_PYTHON" -m torch.distributed.run --nnodes=2 --nproc-per-node=1 --max-restarts=0 \\
  --rdzv-backend=c10d --rdzv-endpoint="$HEAD:29614" --rdzv-id="epilogue-$SLURM_JOB_ID" \\
  -m reference_trainer.train --preset tiny --steps 12 --checkpoint-every 4 \\
  --run-dir "$FAULTLAB_RUN_DIR"
rc=$?
[ "$SLURMD_NODENAME" = "$HEAD" ] && exit 3
exit $rc
"""


def test_an_unfaulted_nodes_non_zero_exit_fails_completes_naming_the_node(
        cluster: Path, tmp_path: Path) -> None:
    """A node hang strikes the job's second node; its first node, struck by nothing, exits 3
    after training completed. The job's one exit code (3) would be excused by the fault;
    each node's own code, from srun's report, fails ``completes`` and names the node."""
    node_script = cluster / f"node-{os.getpid()}-{time.time_ns()}.sh"
    node_script.write_text(NODE_SCRIPT)
    script = tmp_path / "epilogue.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks-per-node=1\n"
                      "export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 "
                      "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1\n"
                      "export HEAD=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)\n"
                      f"srun --kill-on-bad-exit=0 bash {node_script}\n")
    exp = tmp_path / "epilogue.yaml"
    exp.write_text(f"""\
name: slurm_epilogue
target: {{trainer: reference, preset: tiny}}
topology: {{nodes: 2, launcher: slurm, slurm: {{script: {script}, time_limit: "10:00"}}}}
run: {{steps: 12, checkpoint_every: 4, timeout_s: 240}}
faults:
  - {{id: hang, type: node_hang, target: {{node: 1}}, trigger: {{at_step: 4}}, duration_s: 2}}
expect: {{completes: true}}
""")
    result = run_experiment(load_experiment(exp), source=exp, report_dir=tmp_path)
    journal = json.loads(result.journal_path.read_text())
    first, last = hostnames_of(journal)
    [hang] = journal["faults"]
    assert hang["details"]["node"] == last and not hang.get("error"), hang
    assert journal["run"]["exit_codes"] == {first: 3, last: 0}, journal["run"]
    completes = next(s for s in result.slas if s.name == "completes")
    assert not completes.passed and completes.note == \
        f"{first}, struck by no fault, exited with code 3", completes
    assert journal["run"]["slurm"]["final_state"] == "FAILED"
    _assert_nothing_left([journal["run"]["slurm"]["job_id"]])
