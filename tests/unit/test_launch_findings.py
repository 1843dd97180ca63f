"""The team's launch line at work: the cause and the setting that changes it, from the line, the
faults and what the nodes logged (faultlab.observe.launch_findings)."""

from __future__ import annotations

from faultlab.judge.verdict import judge
from faultlab.observe import FaultRecord, compute_metrics
from faultlab.observe.launch_findings import launch_findings
from faultlab.spec import experiment_from_dict
from faultlab.spec.launch import TORCHRUN_DEFAULT

ELASTIC = {"launch": list(TORCHRUN_DEFAULT), "filled": {"nnodes": "1:2"}}
NODE0 = FaultRecord(id="lose-0", type="node_kill",
                    capabilities=("loses_node",), injected_t=10.0, target="node 0")
NODE1 = FaultRecord(id="lose-1", type="node_kill",
                    capabilities=("loses_node",), injected_t=10.0, target="node 1")
STORE_GONE = ("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The "
              "connection to the C10d store has failed. See inner exception for details.")


def causes(launch: object, faults: list[FaultRecord], logs: dict[str, str]) -> list[str]:
    return [f.cause for f in launch_findings(launch, faults, logs)]  # type: ignore[arg-type]


def test_losing_the_node_whose_agent_held_the_store_is_named() -> None:
    logs = {"node0": "", "node1": STORE_GONE}
    assert causes(ELASTIC, [NODE0], logs) == ["store_lost"]
    # a store outside the agents (is_host=false) is not this
    outside = {**ELASTIC, "launch": [*TORCHRUN_DEFAULT, "--rdzv-conf", "is_host=false"]}
    assert "store_lost" not in causes(outside, [NODE0], logs)
    # faultlab's own launcher: none of torchrun's defaults are in play
    assert causes({"launch": "faultlab", "filled": {}}, [NODE0], logs) == []


def test_losing_another_node_on_the_defaults_is_the_slow_rendezvous() -> None:
    logs = {"node0": "", "node1": ""}
    assert causes(ELASTIC, [NODE1], logs) == ["slow_rendezvous"]
    tuned = {**ELASTIC, "launch": [*TORCHRUN_DEFAULT, "--rdzv-conf",
                                   "last_call_timeout=1,keep_alive_interval=1"]}
    assert causes(tuned, [NODE1], logs) == []
    fixed = {**ELASTIC, "filled": {"nnodes": "2"}}  # not elastic: no last call to wait out
    assert causes(fixed, [NODE1], logs) == []


def test_a_restart_that_failed_on_a_stale_address_is_the_shared_store() -> None:
    logs = {"node0": "RuntimeError: Gloo connectFullMesh failed with ... Connection refused"}
    assert causes(ELASTIC, [], logs) == ["stale_worker_store"]
    fixed = {**ELASTIC, "launch": ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
                                   *TORCHRUN_DEFAULT]}
    assert causes(fixed, [], logs) == []


def test_the_verdict_names_the_cause_on_the_sla_it_explains() -> None:
    exp = experiment_from_dict({"name": "x", "target": {"trainer": "reference"},
                                "faults": [{"id": "lose-0", "type": "node_kill",
                                            "target": {"node": 0},
                                            "trigger": {"at_step": 9}}],
                                "expect": {"completes": True}})
    events = [{"t": 1.0, "kind": "start", "rank": 0, "pid": 1, "world_size": 2},
              {"t": 9.0, "kind": "step", "rank": 0, "pid": 1, "step": 9, "world_size": 2}]
    findings = launch_findings(ELASTIC, [NODE0], {"node0": "", "node1": STORE_GONE})
    results = judge(exp, compute_metrics(events, [NODE0]), None, timed_out=False,
                    faults=[NODE0], events=events, findings=findings)
    completes = next(r for r in results if r.name == "completes")
    assert not completes.passed
    assert "the c10d rendezvous store lived in node0's torchrun agent" in completes.note
    assert "to change it: run the store outside the nodes" in completes.note


def test_a_restart_that_never_trained_again_is_named_with_the_shared_store() -> None:
    assert causes(ELASTIC, [], {"node0": ""}) == []
    found = launch_findings(ELASTIC, [], {"node0": ""}, hung_after_restart=True)
    assert [f.cause for f in found] == ["restart_hung"]
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in found[0].change
    fixed = {**ELASTIC, "launch": ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
                                   *TORCHRUN_DEFAULT]}
    assert launch_findings(fixed, [], {"node0": ""}, hung_after_restart=True) == []


def test_the_bar_sets_the_teams_run_beside_faultlabs() -> None:
    from types import SimpleNamespace

    from faultlab.judge.verdict import SLAResult
    from faultlab.side_by_side import bar_rows

    def result(verdict: str, completes: bool, resume: float | None) -> SimpleNamespace:
        metrics = SimpleNamespace(completes=completes, restarts=1, detection_latency_s=0.02,
                                  resume_time_s=resume, recovery_time_s=resume, lost_steps=1)
        return SimpleNamespace(verdict=verdict, metrics=metrics, slas=[
            SLAResult("completes", True, completes, completes)])

    rows = bar_rows(result("fail", False, None), result("pass", True, 6.03))
    assert rows[0] == ("verdict", "FAIL", "PASS")
    assert ("resume_time_s", "not measured", "6.03 s") in rows
    assert rows[-1] == ("SLA completes", "FAIL", "pass")


NVRX = {"launch": ["ft_launcher", "--nnodes", "{nnodes}", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", "{rdzv_endpoint}", "--max-restarts", "2"],
        "filled": {"nnodes": "1:2"}}


def test_ft_launcher_is_named_as_itself_with_its_own_rendezvous_limits() -> None:
    """ft_launcher 0.4.1: the store in node 0's agent as under torchrun; a keep-alive that no
    flag shortens, so a slow rendezvous is named even with the last call tuned; the workers'
    store is never the agent's (c10d), so the shared-store findings are not its."""
    [lost] = launch_findings(NVRX, [NODE0], {"node0": "", "node1": STORE_GONE})
    assert lost.cause == "store_lost" and "node0's ft_launcher agent" in lost.text
    [slow] = launch_findings(NVRX, [NODE1], {"node0": "", "node1": ""})
    assert slow.cause == "slow_rendezvous"
    assert slow.change.startswith("--rdzv-conf last_call_timeout=1 removes the last call; no "
                                  "ft_launcher 0.4.1 flag shortens the keep-alive")
    tuned = {**NVRX, "launch": [*NVRX["launch"], "--rdzv-conf",  # type: ignore[list-item]
                                "last_call_timeout=1,keep_alive_interval=1"]}
    [still] = launch_findings(tuned, [NODE1], {"node0": "", "node1": ""})
    assert still.cause == "slow_rendezvous" and "last call of 30 s" not in still.text
    assert launch_findings(NVRX, [], {"node0": "Gloo connectFullMesh failed"},
                           hung_after_restart=True) == []
def test_a_killed_service_the_ranks_could_not_reach_is_named_whatever_the_launcher() -> None:
    lighthouse = FaultRecord(id="lh", type="service_kill",
                             capabilities=("kills_service",), injected_t=10.0, target="all",
                             details={"service": "lighthouse", "pids": [7]})
    groups = {"launch": ["env", "TORCHFT_LIGHTHOUSE=http://127.0.0.1:{lighthouse_port}",
                         "torchrun", "--master-port", "{node_master_port}"],
              "filled": {"lighthouse_port": "41234"}}
    lost = ("RuntimeError: failed to connect to http://127.0.0.1:41234 within timeout of 3s; "
            "verify the address is correct and the server is running")
    [finding] = launch_findings(groups, [lighthouse], {"node0": lost, "node1": ""})
    assert finding.cause == "service_lost" and "'lighthouse' (port 41234)" in finding.text
    assert "completes" in finding.affects and "survivor_restarts" in finding.affects
    # a launcher none of whose mechanisms are torchrun's still gets it
    other = {**groups, "launch": ["my_launcher", "{node_master_port}"]}
    assert causes(other, [lighthouse], {"node0": lost}) == ["service_lost"]
    # the ranks never tried to reach it (the job ended first): nothing to name
    assert causes(groups, [lighthouse], {"node0": "step 30 loss 0.7", "node1": ""}) == []


def test_an_abort_at_exit_is_the_trainers_finding_with_its_fix() -> None:
    """The gloo race at exit: faultlab no longer hides it (the interposer keeps nothing), so
    a rank that died of it is a finding, whatever launched the job, with the fix."""
    from faultlab.observe.launch_findings import ABORT_AT_EXIT, abort_at_exit

    assert abort_at_exit({"node0": "step 16 loss 0.1\n", "node1": ""}) == []
    logs = {"node0": "", "node1": f"step 16\n{ABORT_AT_EXIT}\n"}
    (finding,) = abort_at_exit(logs)
    assert finding.cause == "abort_at_exit"
    assert "1 rank exit(s) on node1 died of SIGABRT" in finding.text
    assert "pytorch/pytorch#190489" in finding.text and "7 of 60" in finding.text
    assert "os._exit(0)" in finding.change and "Python 3.14" in finding.change
    assert {"golden_run_fault_free", "max_restarts"} <= set(finding.affects)


def test_a_killed_etcd_is_named_from_its_clients_port_form() -> None:
    """The etcd client (urllib3) logs port=NNNN, not host:NNNN."""
    etcd = FaultRecord(id="kill-etcd", type="service_kill",
                       capabilities=("kills_service",), injected_t=10.0, target="all",
                       details={"service": "etcd"})
    line = {"launch": list(TORCHRUN_DEFAULT), "filled": {"etcd_port": "48571"}}
    logs = {"node0": "urllib3.exceptions.MaxRetryError: HTTPConnectionPool(host='127.0.0.1', "
                     "port=48571): Max retries exceeded (Caused by NewConnectionError: "
                     "Failed to establish a new connection: [Errno 111] Connection refused)"}
    assert causes(line, [etcd], logs) == ["service_lost"]


# What node1's log held when the reference trainer's rank 1 died of a corrupted heap in CI
# (stop 43): glibc's check, then the torchelastic agent's line for the dead worker.
AGENT = ("E1128 05:45:39.206000 18199 torch/distributed/elastic/multiprocessing/api.py:1002] "
         "failed (exitcode: {code}) local_rank: 0 (pid: {pid}) of binary: /venv/bin/python")
HEAP_CRASH = "malloc(): unaligned tcache chunk detected\n" + AGENT.format(code=-6, pid=18253)


def test_a_crash_no_fault_sent_is_named_with_the_rank_its_step_and_the_heap_check() -> None:
    """A restart nobody injected must not pass unexplained: the verdict of max_restarts says
    which rank died of which signal, after which step, and what glibc found."""
    from faultlab.observe.launch_findings import native_crash

    kill = FaultRecord(id="kill-rank-1", type="rank_kill", injected_t=10.0, target="rank 1",
                       details={"signal": "SIGKILL", "pids_by_rank": {"1": 18207}})
    events = [{"kind": "step", "pid": 18253, "rank": 1, "step": s} for s in (39, 40)]
    logs = {"node0": "", "node1": AGENT.format(code=-9, pid=18207) + "\n" + HEAP_CRASH}
    (finding,) = native_crash(logs, [kill], events)
    assert finding.cause == "native_crash" and finding.no_fix and not finding.fix
    assert finding.text.startswith("rank 1 on node1 (pid 18253) died of SIGABRT after step 40, "
                                   "glibc: 'malloc(): unaligned tcache chunk detected'")
    assert "18207" not in finding.text  # the SIGKILL was the fault's
    assert "ulimit -c unlimited" in finding.change and "max_restarts" in finding.affects
    # a signal the run's own fault sent is the fault, not a crash (a rank_kill with ABRT)
    aborted = FaultRecord(id="abort-1", type="rank_kill", injected_t=10.0, target="rank 1",
                          details={"signal": "SIGABRT", "pids_by_rank": {"1": 18253}})
    assert native_crash(logs, [aborted], events) == []
    # no records of the process: its local rank; no heap check: the signal alone
    (bare,) = native_crash({"node0": AGENT.format(code=-11, pid=4242)})
    assert bare.text.startswith("local rank 0 on node0 (pid 4242) died of SIGSEGV: ")
    assert "glibc" not in bare.text
    # the gloo race at exit is abort_at_exit's; a worker that exited with an error is no crash
    from faultlab.observe.launch_findings import ABORT_AT_EXIT
    at_exit = f"{ABORT_AT_EXIT}\n" + AGENT.format(code=-6, pid=5)
    assert native_crash({"node0": at_exit, "node1": AGENT.format(code=1, pid=6)}) == []
    # under torchrun --tee, each line of the worker's output carries its local rank
    (teed,) = native_crash({"node0": "[default0]:" + HEAP_CRASH})
    assert "glibc: 'malloc(): unaligned tcache chunk detected'" in teed.text
    # NCCL's watchdog takes a rank down on purpose after a timeout or a lost peer
    watchdog = ("terminate called after throwing an instance of 'c10::DistBackendError'\n"
                + AGENT.format(code=-6, pid=7))
    assert native_crash({"node0": watchdog}) == []


def test_the_crash_explains_the_extra_restart_in_the_verdict() -> None:
    from faultlab.observe.launch_findings import native_crash

    exp = experiment_from_dict({
        "name": "rk", "target": {"trainer": "reference"}, "run": {"steps": 40},
        "expect": {"max_restarts": 1}})
    metrics = compute_metrics(
        [{"kind": "start", "t": 1.0, "rank": 0, "restart": r, "resumed_from_step": 0}
         for r in range(3)], [])
    found = native_crash({"node1": HEAP_CRASH})
    (sla,) = [s for s in judge(exp, metrics, None, timed_out=False, faults=[], findings=found)
              if s.name == "max_restarts"]
    assert not sla.passed and "died of SIGABRT, glibc: 'malloc(): unaligned tcache" in sla.note
