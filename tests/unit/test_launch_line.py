"""``target.launch``: the team's own launch line, its placeholders, and the located errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from faultlab.spec import experiment_from_dict, load_experiment
from faultlab.spec.launch import TORCHRUN_DEFAULT, addressing_problem, fixed_port, trainer_argv
from faultlab.targets.launcher import LocalJob
from tests.unit.test_spec import doc, one_problem

TRAIN = "[python, examples/fsdp2_dcp/train.py, --steps, '4']"


def launch(line: str, topology: str = "topology: {nodes: 2, procs_per_node: 1}") -> str:
    return doc(target=f"target: {{command: {TRAIN}, launch: {line}}}", topology=topology)


def test_a_command_runs_under_plain_torchrun_and_the_reference_trainer_under_faultlabs() -> None:
    own = experiment_from_dict({"name": "a", "target": {"command": ["sleep", "1"]}})
    assert own.target.launch_line() == (*TORCHRUN_DEFAULT, "--no-python")  # not a script
    script = experiment_from_dict({"name": "a", "target": {
        "command": ["python", "examples/fsdp2_dcp/train.py"]}})
    assert script.target.launch_line() == TORCHRUN_DEFAULT
    assert experiment_from_dict({"name": "a"}).target.launch_line() is None  # tuned
    tuned = experiment_from_dict({"name": "a", "target": {
        "command": ["python", "examples/fsdp2_dcp/train.py"], "launch": "faultlab"}})
    assert tuned.target.launch_line() is None
    # inside docker nodes a command runs under the same plain torchrun; on Slurm the batch
    # script starts the nodes
    assert script.target.launch_line("docker") == TORCHRUN_DEFAULT
    assert script.target.launch_line("slurm") is None


def test_the_teams_line_as_a_string_or_a_list() -> None:
    exp = experiment_from_dict({"name": "a", "target": {
        "command": ["python", "examples/fsdp2_dcp/train.py"],
        "launch": "torchrun --nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d "
                  "--rdzv-endpoint {rdzv_endpoint} --max-restarts 2"}})
    assert exp.target.launch_line()[:3] == ("torchrun", "--nnodes", "1:2")


@pytest.mark.parametrize(("line", "where", "message"), [
    ("[torchrun, --nnodes, '2', --rdzv-endpoint, '{rdzv_endpoint}', --foo, '{bar}']",
     "target.launch[6]", "{bar} is not a placeholder faultlab fills; it fills {run_dir}, "),
    ("[torchrun, --nnodes, '2', --rdzv-endpoint, 'localhost:29400']", "target.launch[4]",
     "'localhost:29400' is a fixed port: the golden run, every run and runs in parallel would "
     "all bind it; write {rdzv_endpoint}"),
    ("[torchrun, --nnodes, '2', --master-addr, '{master_addr}', --master-port, '29500']",
     "target.launch[6]", "'29500' is a fixed port"),
    # a client of an etcd of its own at a fixed address: the fix is a service, not a free port
    ("[torchrun, --nnodes, '2', --rdzv-backend, etcd-v2, --rdzv-endpoint, '127.0.0.1:2379']",
     "target.launch[6]", "'127.0.0.1:2379' is a fixed port: the golden run, every run and runs "
     "in parallel would share the store or etcd there, and each other's rendezvous with it; run "
     "it as a target.services entry and write 127.0.0.1:{store_port}"),
    ("[torchrun, --nnodes, '2', --nproc-per-node, '1']", "target.launch",
     "2 nodes, but nothing in the line tells them where to meet: give the rendezvous "
     "(--rdzv-endpoint {rdzv_endpoint}, with --rdzv-backend c10d) or a static master"),
    ("[no_such_launcher_here, -x]", "target.launch[0]",
     "'no_such_launcher_here' is not found: not on PATH"),
    ("faultlab", None, None),
    # is_host=false: the agents are clients of a store at the endpoint; faultlab's own
    # per-launch endpoint has none, so the job could never start (issue 38's bad input)
    ("[torchrun, --nnodes, '{nnodes}', --rdzv-backend, c10d, --rdzv-endpoint, "
     "'{rdzv_endpoint}', --rdzv-conf, 'is_host=false,last_call_timeout=1']",
     "target.launch[6]",
     "--rdzv-conf is_host=false makes every agent a client of a store that something else "
     "runs at the endpoint, but {rdzv_endpoint} is an address faultlab picks per launch"),
])
def test_a_bad_launch_line_is_one_located_error(line: str, where: str | None,
                                                message: str | None) -> None:
    if where is None:
        experiment_from_dict({"name": "a", "target": {"command": ["sleep", "1"],
                                                      "launch": line}})
        return
    _line, at, text = one_problem(launch(line))
    assert at == where and text.startswith(message), text


def test_is_host_false_with_a_store_service_is_accepted() -> None:
    """The store run as a service of the team's, at its own port: what is_host=false means."""
    exp = experiment_from_dict({"name": "a", "target": {
        "command": ["sleep", "1"],
        "services": {"store": ["python", "-c", "import time; time.sleep(60)",
                               "{store_port}"]},
        "launch": ["torchrun", "--nnodes", "{nnodes}", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", "127.0.0.1:{store_port}", "--rdzv-conf",
                   "is_host=false"]}})
    assert exp.target.services["store"][0] == "python"


ETCD_LINE = ("[torchrun, --nnodes, '{nnodes}', --rdzv-backend, etcd-v2, --rdzv-endpoint, "
             "'127.0.0.1:{etcd_port}']")


@pytest.mark.parametrize("services,line,where,message", [
    # etcd that listens on another port than the one the rendezvous dials
    ("{etcd: [etcd, --enable-v2=true, --listen-client-urls, 'http://127.0.0.1:2379', "
     "--advertise-client-urls, 'http://127.0.0.1:{etcd_port}']}", ETCD_LINE,
     "target.services.etcd[3]", "the etcd service 'etcd' does not listen where the rendezvous "
                                "looks: its --listen-client-urls must carry {etcd_port}"),
    # etcd 3.4 without the v2 API: torch's etcd backends would get 404s
    ("{etcd: [etcd, --listen-client-urls, 'http://127.0.0.1:{etcd_port}']}", ETCD_LINE,
     "target.services.etcd[0]", "the etcd service 'etcd' does not serve the v2 API"),
    # an etcd backend at faultlab's own per-launch endpoint, where no etcd runs
    ("{}", "[torchrun, --nnodes, '{nnodes}', --rdzv-backend, etcd, --rdzv-endpoint, "
           "'{rdzv_endpoint}']",
     "target.launch[6]", "--rdzv-backend etcd needs an etcd server at the endpoint"),
    # a store whose own line never names its port: it would listen elsewhere
    ("{store: [python, -c, 'import time; time.sleep(60)']}",
     "[torchrun, --nnodes, '{nnodes}', --rdzv-backend, c10d, --rdzv-endpoint, "
     "'127.0.0.1:{store_port}', --rdzv-conf, is_host=false]",
     "target.services.store[0]", "--rdzv-endpoint points at the service 'store''s port"),
])
def test_a_rendezvous_service_that_would_not_answer_is_refused_at_load(
        services: str, line: str, where: str, message: str) -> None:
    text = doc(target=f"target: {{command: {TRAIN}, services: {services}, launch: {line}}}",
               topology="topology: {nodes: 2, procs_per_node: 1}")
    _line, at, problem = one_problem(text)
    assert at == where and problem.startswith(message), problem


def test_the_etcd_service_faultlab_benchmarks_is_accepted() -> None:
    from faultlab.observe.launch_fixes import ETCD_SERVICE

    exp = experiment_from_dict({"name": "a", "topology": {"nodes": 2}, "target": {
        "command": ["sleep", "1"], "services": {"etcd": list(ETCD_SERVICE)},
        "launch": ["torchrun", "--nnodes", "{nnodes}", "--rdzv-backend", "etcd-v2",
                   "--rdzv-endpoint", "127.0.0.1:{etcd_port}"]}})
    assert exp.target.services["etcd"][0] == "etcd"


def test_one_node_needs_no_address_and_a_static_master_is_an_address() -> None:
    assert addressing_problem(["torchrun", "--nproc-per-node", "2"], 1) is None
    assert addressing_problem(["torchrun", "--master-addr", "{master_addr}"], 2) is None
    assert addressing_problem(["env", "A=1", "torchrun", "--rdzv-endpoint", "h:{master_port}"],
                              2) is None
    assert fixed_port(["torchrun", "--rdzv-endpoint=node0:29400"]) == (1, "node0:29400")


def test_the_trainer_follows_the_line_without_the_interpreter_torchrun_supplies() -> None:
    py = sys.executable
    assert trainer_argv(["torchrun"], [py, "train.py", "--x"], (py,)) == ["train.py", "--x"]
    assert trainer_argv(["torchrun"], [py, "-m", "pkg.train"], (py,)) == ["-m", "pkg.train"]
    assert trainer_argv(["torchrun", "--no-python"], [py, "t.py"], (py,)) == [py, "t.py"]
    assert trainer_argv(["env", "X=1", "torchrun"], [py, "t.py"], (py,)) == ["t.py"]
    assert trainer_argv(["srun"], [py, "t.py"], (py,)) == [py, "t.py"]  # not torchrun's


def test_each_node_gets_the_line_filled_in(tmp_path: Path) -> None:
    job = LocalJob(command=[sys.executable, "train.py"], run_dir=tmp_path, nodes=2, min_nodes=1,
                   max_restarts=2, launch_line=(
                       "torchrun", "--nnodes", "{nnodes}", "--node-rank", "{node_rank}",
                       "--rdzv-backend", "c10d", "--rdzv-endpoint", "{rdzv_endpoint}",
                       "--max-restarts", "{max_restarts}", "--log-dir", "{run_dir}/tl"))
    line = job.node_line(1, "127.0.0.1:4242")
    assert line[0] == str(Path(sys.executable).parent / "torchrun")  # the venv's torchrun
    assert line[1:] == ["--nnodes", "1:2", "--node-rank", "1", "--rdzv-backend", "c10d",
                        "--rdzv-endpoint", "127.0.0.1:4242", "--max-restarts", "2",
                        "--log-dir", f"{tmp_path.resolve()}/tl", "train.py"]
    assert job.filled == {"nnodes": "1:2", "rdzv_endpoint": "127.0.0.1:4242",
                          "max_restarts": "2", "run_dir": str(tmp_path.resolve())}
    # the team's line runs the team's rendezvous: no store of faultlab's, no env of its agents
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in job.node_environment("node0")


def test_a_rendezvous_outside_the_nodes_holds_no_node_back(tmp_path: Path) -> None:
    """A line whose store is a service of its own (is_host=false, etcd) names neither
    {rdzv_endpoint} nor {master_port}: no node listens for the others, so node 1 starts at
    once. (Waiting for node 0 to listen held node 1 back 60 s, and the job trained on one
    node and passed.)"""
    import time

    line = (sys.executable, "-c", "import time; time.sleep(30)", "--port", "{run_dir}")
    t0 = time.monotonic()
    with LocalJob(command=["train.py"], run_dir=tmp_path, nodes=2, max_restarts=0,
                  launch_line=line) as job:
        assert job.agent_pid("node1") > 0
        assert time.monotonic() - t0 < 20


NVRX_LINE = ("[ft_launcher, --nnodes, '{nnodes}', --nproc-per-node, '1', --rdzv-backend, c10d, "
             "--rdzv-endpoint, '{rdzv_endpoint}', --max-restarts, '2', "
             "--ft-rank-heartbeat-timeout, '5']")


def test_a_missing_ft_launcher_is_refused_at_load_naming_the_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVRx's launcher not installed (no ft_launcher beside the interpreter, none on PATH): the
    experiment is refused while it loads, before anything is launched, at the launcher's place
    in the line. With it installed (the examples extra), the same document loads."""
    document = tmp_path / "nvrx.yaml"
    document.write_text(launch(NVRX_LINE))
    assert load_experiment(document).target.launch[0] == "ft_launcher"  # installed: it loads
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    monkeypatch.setenv("PATH", str(empty))
    _line, at, text = one_problem(launch(NVRX_LINE))
    assert at == "target.launch[0]", text
    assert text.startswith("'ft_launcher' is not found: not on PATH"), text


def test_ranks_take_faultlabs_own_omp_threads_else_the_cores_shared_among_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from faultlab.targets.launcher import rank_threads

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [rank_threads(w) for w in (1, 2, 3, 16)] == ["8", "4", "2", "1"]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a host shared with other jobs (the suite)
    assert [rank_threads(w) for w in (1, 2)] == ["1", "1"]
