"""faultlab init: the user's torchrun line kept as target.launch (placeholders only where a
node or a launch must differ), the topology read from its flags, a starter experiment written
from measured values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from faultlab.engine.starter import (
    InitError,
    TorchrunArgs,
    measure,
    parse_torchrun,
    render,
    starter_document,
)
from faultlab.spec import experiment_from_dict


@pytest.mark.parametrize("argv,nodes,min_nodes,procs,command", [
    (["torchrun", "--nnodes", "1:2", "--nproc-per-node=2", "--rdzv-backend", "c10d",
      "train.py", "--steps", "9"], 2, 1, 2, ["python", "train.py", "--steps", "9"]),
    (["python", "-m", "torch.distributed.run", "--nproc_per_node", "3", "--standalone", "-m",
      "pkg.train"], 1, None, 3, ["python", "-m", "pkg.train"]),
    (["torchrun", "--no-python", "./run.sh", "x"], 1, None, 1, ["./run.sh", "x"]),
    (["python", "train.py"], 1, None, 1, ["python", "train.py"]),
])
def test_torchrun_flags_become_the_topology(argv: list[str], nodes: int, min_nodes: int | None,
                                            procs: int, command: list[str]) -> None:
    tr = parse_torchrun(argv)
    assert (tr.nodes, tr.min_nodes, tr.procs_per_node, tr.command) == \
        (nodes, min_nodes, procs, command)


ISSUE = ["torchrun", "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", "localhost:29400", "--max-restarts", "2", "train.py", "--ckpt-dir",
         "ckpt"]


@pytest.mark.parametrize("argv,launch,topology", [
    # the issue's line: every flag kept, in order; only the fixed endpoint is per launch
    (ISSUE, ["torchrun", "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", "{rdzv_endpoint}", "--max-restarts", "2"], (2, 1, 1, 2)),
    # the = form and torch's underscore spellings stay as written
    (["torchrun", "--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=node0:29400",
      "--rdzv-id", "job7", "--max_restarts=1", "t.py"],
     ["torchrun", "--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint={rdzv_endpoint}",
      "--rdzv-id", "{rdzv_id}", "--max_restarts=1"], (2, None, 1, 1)),
    # a static master: address, port and node rank are per launch and per node
    (["torchrun", "--nnodes", "2", "--node_rank", "0", "--master-addr", "node0",
      "--master-port", "29500", "--max-restarts", "3", "--log-dir", "logs", "t.py"],
     ["torchrun", "--nnodes", "2", "--node_rank", "{node_rank}", "--master-addr",
      "{master_addr}", "--master-port", "{master_port}", "--max-restarts", "3", "--log-dir",
      "logs"], (2, None, 1, 3)),
    # --standalone: one node, torchrun makes its own endpoint; kept as is (-m goes with the
    # command, which follows the line as -m pkg.train)
    (["python3", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3", "-m",
      "pkg.train"], ["python", "-m", "torch.distributed.run", "--standalone",
                     "--nproc_per_node", "3"], (1, None, 3, 0)),
    # one node, no rendezvous flags: torchrun picks a free port itself; kept as is
    (["torchrun", "--nproc-per-node", "2", "--max-restarts", "1", "-r3", "t.py"],
     ["torchrun", "--nproc-per-node", "2", "--max-restarts", "1", "-r3"], (1, None, 2, 1)),
    # two nodes and nothing saying where they meet (on a cluster the environment says it):
    # the line's own rendezvous gets what it lacks
    (["/opt/bin/torchrun", "--nnodes", "2", "t.py"],
     ["torchrun", "--nnodes", "2", "--master-addr", "{master_addr}", "--master-port",
      "{master_port}", "--node-rank", "{node_rank}"], (2, None, 1, 0)),
    (["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "--no-python", "./run.sh"],
     ["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "--no-python",
      "--rdzv-endpoint", "{rdzv_endpoint}"], (2, None, 1, 0)),
    # not a torchrun line: no launch of its own, faultlab's plain torchrun fills everything
    (["python", "train.py", "--steps", "4"], None, (1, None, 1, 3)),
])
def test_the_whole_torchrun_line_becomes_target_launch(
        argv: list[str], launch: list[str] | None,
        topology: tuple[int, int | None, int, int]) -> None:
    tr = parse_torchrun(argv)
    assert tr.launch == launch
    assert (tr.nodes, tr.min_nodes, tr.procs_per_node, tr.max_restarts) == topology
    if launch is not None:  # what is left is exactly what the spec accepts
        experiment_from_dict({"name": "t", "target": {"command": ["sleep", "1"],
                                                      "launch": launch},
                              "topology": {"nodes": tr.nodes, "min_nodes": tr.min_nodes}})


def test_each_replaced_flag_says_what_it_became_and_why() -> None:
    tr = parse_torchrun(["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint=localhost:29400", "--rdzv-id", "job7", "t.py"])
    assert [c.shown() for c in tr.changes] == [
        "--rdzv-endpoint=localhost:29400 runs as --rdzv-endpoint={rdzv_endpoint} (a free "
        "HOST:PORT faultlab picks for every launch): the golden run, the experiment's runs and "
        "runs in parallel must never collide on a port, and the experiment keeps "
        "{rdzv_endpoint}",
        "--rdzv-id job7 runs as --rdzv-id {rdzv_id} (an id of each launch's own): with a fixed "
        "id, runs in parallel could join each other's rendezvous, and the experiment keeps "
        "{rdzv_id}"]
    assert parse_torchrun(["torchrun", "--standalone", "t.py"]).changes == []


def _starter(tmp_path: Path, tr: TorchrunArgs) -> tuple[dict[str, object], str]:
    (tmp_path / "train.py").write_text("")
    m = measure(_events(tmp_path / "ckpt"), [], ok=True, wall_s=20.0)
    doc = starter_document("mine", tr, m)
    return doc, render(doc, tr, m, ["torchrun", "train.py"])


def test_the_starter_runs_the_users_own_line(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    doc, text = _starter(tmp_path, parse_torchrun(ISSUE))
    assert doc["target"] == {
        "command": ["python", "train.py", "--ckpt-dir", "{run_dir}/checkpoints"],
        "launch": ["torchrun", "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend",
                   "c10d", "--rdzv-endpoint", "{rdzv_endpoint}", "--max-restarts", "2"]}
    assert doc["topology"] == {"nodes": 2, "procs_per_node": 1, "max_restarts": 2,
                               "min_nodes": 1}
    assert "# It runs your own launch line (target.launch) on every node" in text
    loaded = experiment_from_dict(yaml.safe_load(text))
    assert loaded.target.launch_line() == tuple(doc["target"]["launch"])  # type: ignore[index]
    assert "NOTE: your line restarts nothing" not in text


def test_a_line_that_restarts_nothing_is_kept_and_said(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun restarts nothing by default: the experiment keeps that, as the cluster would,
    and says how to give the job a restart budget."""
    monkeypatch.chdir(tmp_path)
    doc, text = _starter(tmp_path, parse_torchrun(["torchrun", "--standalone", "train.py"]))
    assert doc["target"]["launch"] == ["torchrun", "--standalone"]  # type: ignore[index]
    assert doc["topology"]["max_restarts"] == 0  # type: ignore[index]
    assert "# NOTE: your line restarts nothing (no --max-restarts: torchrun defaults to 0)" in \
        text


def test_a_command_that_is_not_torchrun_runs_under_plain_torchrun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    doc, text = _starter(tmp_path, parse_torchrun(["python", "train.py"]))
    assert "launch" not in doc["target"]  # type: ignore[operator]
    assert doc["topology"]["max_restarts"] == 3  # type: ignore[index]
    assert "# No target.launch: the command was not a torchrun line, so it runs under plain " \
        "torchrun (launch: torchrun)" in text


@pytest.mark.parametrize("argv,message", [
    ([], "give the training command after --"),
    (["torchrun", "--nproc-per-node", "gpu", "t.py"], "--nproc-per-node: give a number"),
    (["torchrun", "--nnodes", "two", "t.py"], "--nnodes: expected an integer, got 'two'"),
    (["torchrun", "--nproc-per-node", "2"], "no training script"),
])
def test_bad_torchrun_lines_say_why(argv: list[str], message: str) -> None:
    with pytest.raises(InitError, match=message):
        parse_torchrun(argv)


def _events(ckpt_dir: Path) -> list[dict[str, object]]:
    ev: list[dict[str, object]] = [{"t": 100.0, "kind": "start", "rank": 0, "pid": 1}]
    for s in range(1, 13):
        ev.append({"t": 104.0 + s, "kind": "step", "rank": 0, "step": s, "step_time_s": 1.0,
                   "step_source": "optimizer_state"})
        if s % 4 == 0:
            ev.append({"t": 104.5 + s, "kind": "checkpoint_saved", "rank": 0, "step": s,
                       "seconds": 0.25, "path": str(ckpt_dir / f"step_{s}")})
    # what faultlab appends once it has read the final checkpoint back (engine.foreign)
    ev.append({"t": 120.0, "kind": "final_digest", "rank": 0, "digest": "d" * 64,
               "source": "final_checkpoint", "path": str(ckpt_dir / "step_12"), "step": 12})
    return ev


def test_a_starter_experiment_from_measured_values(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    ckpt = tmp_path / "ckpts"
    log = tmp_path / "node0.log"
    log.write_text("step 1 loss 2.5000\nstep 2 loss 2.25\n")
    m = measure(_events(ckpt), [log], ok=True, wall_s=20.0)
    assert (m.steps, m.startup_s, m.step_time_s, m.checkpoint_every) == (12, 5.0, 1.0, 4)
    assert m.checkpoint_dir == str(ckpt) and m.final_checkpoint
    tr = parse_torchrun(["torchrun", "--nnodes", "2", "train.py", "--ckpt-dir", str(ckpt)])
    doc = starter_document("mine", tr, m)
    assert doc["target"]["command"] == ["python", "train.py", "--ckpt-dir",
                                        "{run_dir}/checkpoints"]
    assert doc["faults"][0]["trigger"] == {"at_step": 6} and doc["faults"][0]["target"] == \
        {"rank": 1}
    assert doc["expect"]["bitwise_equal_to_golden"] is True
    # relative bounds, which every run measures its units for again: they hold on a slower
    # machine (recovery replays at most the 4 steps since a checkpoint, twice over)
    assert doc["expect"]["resume_time_s"] == {"cold_starts": 3}
    assert doc["expect"]["recovery_time_s"] == {"cold_starts": 3, "step_times": 8}
    assert doc["expect"]["lost_steps"] == 4
    assert measure(_events(ckpt), [log], ok=True, wall_s=20.0, launched_t=98.0).startup_s == 7.0
    text = render(doc, tr, m, ["torchrun", "--nnodes", "2", "train.py"])
    assert text.startswith("# mine: a starter chaos experiment")
    loaded = yaml.safe_load(text)
    assert experiment_from_dict(loaded).observe.log_pattern is not None


def test_the_bitwise_check_whenever_the_final_checkpoint_reads_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Trainer-style --out '{run_dir}/hfout' (a name init does not know, already in the run
    directory) gets the check as much as a --ckpt-dir init rewrote; without a final
    checkpoint read back, the file says why it has none."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    run_dir = tmp_path / "reports" / "probe" / "job"
    tr = parse_torchrun(["torchrun", "train.py", "--out", "{run_dir}/hfout"])
    m = measure(_events(run_dir / "hfout"), [], ok=True, wall_s=20.0)
    doc = starter_document("hf", tr, m)
    assert doc["target"]["command"] == ["python", "train.py", "--out", "{run_dir}/hfout"]
    assert doc["expect"]["bitwise_equal_to_golden"] is True
    unread = measure([e for e in _events(run_dir / "hfout") if e["kind"] != "final_digest"],
                     [], ok=True, wall_s=20.0)
    doc = starter_document("hf", tr, unread)
    assert "bitwise_equal_to_golden" not in doc["expect"]
    assert "# No bitwise_equal_to_golden: the final checkpoint could not be read back." in \
        render(doc, tr, unread, ["torchrun", "train.py"])


def test_two_fault_free_runs_pick_the_starters_verdict(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Bitwise for a trainer whose two fault-free runs ended equal; the noise verdict, with
    the step they differ from and the causes, for one whose runs differ (issue 45)."""
    from faultlab.engine.starter import _compare

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    tr = parse_torchrun(["torchrun", "train.py", "--ckpt-dir", "{run_dir}/ckpt"])
    runs = []
    for name, loss in (("a", "0.5"), ("b", "0.5000001")):
        (tmp_path / name / "logs").mkdir(parents=True)
        (tmp_path / name / "logs" / "node0.log").write_text(
            f"step 1 loss 2.5\nstep 2 loss 1.25\nstep 3 loss {loss}\n")
        runs.append((tmp_path / name, _events(tmp_path / name / "ckpt")))
    m = measure(runs[0][1], [tmp_path / "a" / "logs" / "node0.log"], ok=True, wall_s=20.0)
    m.reproducible = _compare(m, *runs[0], *runs[0])
    assert m.reproducible.reproducible
    doc = starter_document("same", tr, m)
    assert doc["expect"]["bitwise_equal_to_golden"] is True and "golden" not in doc
    assert "# Two fault-free runs ended bitwise equal" in render(doc, tr, m, ["train.py"])
    differ = [(d, [{**e, "digest": "e" * 64} if e["kind"] == "final_digest" else e
                   for e in ev]) for d, ev in runs[1:]]
    m.reproducible = _compare(m, *runs[0], *differ[0])
    assert not m.reproducible.reproducible and m.reproducible.first_step == 3
    doc = starter_document("noisy", tr, m)
    assert "bitwise_equal_to_golden" not in doc["expect"]
    assert doc["expect"]["matches_golden_within_noise"] is True and doc["golden"] == {"runs": 2}
    text = render(doc, tr, m, ["train.py"])
    assert "# Two fault-free runs differ from step 3 (largest loss difference 1e-07)" in text
    assert "CUBLAS_WORKSPACE_CONFIG=:4096:8" in text
    assert experiment_from_dict(yaml.safe_load(text)).golden_runs == 2


def test_a_run_without_steps_is_refused_with_the_reason(tmp_path: Path) -> None:
    m = measure([{"t": 1.0, "kind": "start", "rank": 0}], [], ok=True, wall_s=3.0)
    with pytest.raises(InitError, match="faultlab saw no optimizer steps"):
        starter_document("x", parse_torchrun(["python", "t.py"]), m)
