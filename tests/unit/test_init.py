"""faultlab init: torchrun flags read, a starter experiment written from measured values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from faultlab.engine.starter import InitError, measure, parse_torchrun, render, starter_document
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
    assert doc["expect"]["resume_time_s"] == 20 and doc["expect"]["lost_steps"] == 4
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


def test_a_run_without_steps_is_refused_with_the_reason(tmp_path: Path) -> None:
    m = measure([{"t": 1.0, "kind": "start", "rank": 0}], [], ok=True, wall_s=3.0)
    with pytest.raises(InitError, match="faultlab saw no optimizer steps"):
        starter_document("x", parse_torchrun(["python", "t.py"]), m)
