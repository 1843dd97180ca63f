"""The storage faults' YAML (issue 23): what loads, and one located line per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlab.faults.storage_io import IoErrorFault
from faultlab.storage.mount import propagates
from faultlab.storage.rules import Rule
from tests.unit.test_spec import doc, one_problem, parse_experiment


def fault(line: str) -> str:
    return f"- {{target: all, trigger: {{at_step: 5}}, duration_s: 30, {line}}}"


def test_the_four_faults_load_with_the_issues_params() -> None:
    exp = parse_experiment(doc(
        fault("type: io_error, params: {errno: ENOSPC, ops: [write, fsync], path: '*.distcp', "
              "percent: 50, after_bytes: 4096}") + "\n" +
        fault("type: io_latency, params: {delay_ms: 200, bandwidth_mb_s: 5, ops: [write]}") +
        "\n" + fault("type: io_hang, params: {ops: [fsync], path: 'step_*/*'}") + "\n" +
        "- {type: disk_full, target: {node: 1}, trigger: {after_event: {kind: "
        "checkpoint_saved, count: 2}}, until: reaction, params: {free_bytes: 0}}"))
    err, slow, hang, full = (f.build() for f in exp.faults)
    assert err.rule() == {"errno": "ENOSPC", "ops": ["write", "fsync"], "path": "*.distcp",
                          "percent": 50.0, "after_bytes": 4096}
    assert slow.rule()["bandwidth_mb_s"] == 5 and hang.rule()["hang"] is True
    assert full.rule() == {"free_bytes": 0, "ops": []}
    for f in (err, slow, hang, full):  # what the passthrough accepts
        Rule.from_dict({**f.rule(), "id": "x"})
    assert IoErrorFault.Params().ops == ("write",)


@pytest.mark.parametrize(("line", "path", "message"), [
    ("type: io_error, params: {errno: ENOENT}", "faults[0].params.errno",
     "unknown errno 'ENOENT'; valid errnos: ENOSPC, EIO, EROFS, EDQUOT, ESTALE, EACCES"),
    ("type: io_error, params: {ops: [write, chmod]}", "faults[0].params.ops",
     "unknown op 'chmod'; valid ops: write, fsync, create, rename, open, read, mkdir, unlink"),
    ("type: io_hang, params: {ops: [fsynk]}", "faults[0].params.ops",
     "unknown op 'fsynk'; did you mean 'fsync'? valid ops: write, fsync, create, rename, open, "
     "read, mkdir, unlink"),
    ("type: io_latency, params: {delay_ms: 5, percent: 150}", "faults[0].params.percent",
     "percent must be within 0-100, got 150.0"),
    ("type: io_error, params: {path: /etc/*}", "faults[0].params.path",
     "path '/etc/*' is outside the job's checkpoint storage: give a glob relative to the "
     "checkpoint directory, e.g. '*.distcp' or 'step_*/.metadata*' ('*' matches every file)"),
    ("type: io_hang, params: {path: '../events/*'}", "faults[0].params.path",
     "path '../events/*' is outside the job's checkpoint storage: give a glob relative to the "
     "checkpoint directory, e.g. '*.distcp' or 'step_*/.metadata*' ('*' matches every file)"),
])
def test_bad_input_is_one_located_line(line: str, path: str, message: str) -> None:
    assert one_problem(doc(fault(line))) == (5, path, message)


def test_a_storage_fault_must_be_undone() -> None:
    hang = "- {type: io_hang, target: all, trigger: {at_step: 5}}"
    assert one_problem(doc(hang))[1:] == (
        "faults[0]", "io_hang must be undone: add duration_s: <seconds>, until: reaction, or "
                     "both (whichever comes first)")
    assert parse_experiment(doc(fault("type: disk_full"), topology=(
        "topology: {nodes: 2, procs_per_node: 1, launcher: docker}"))).faults


def test_slurm_is_refused_where_the_shared_directory_does_not_propagate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory on a private mount of this host: the Slurm nodes would not see a mount made
    there; the load-time line says so and what to do."""
    import faultlab.faults.storage_io as storage_io

    monkeypatch.setattr(storage_io, "propagates", lambda path: False)
    slurm = (f"topology: {{nodes: 2, procs_per_node: 1, launcher: slurm, slurm: "
             f"{{time_limit: '10:00', run_dir: {tmp_path}}}}}")
    line, path, message = one_problem(doc(fault("type: disk_full"), topology=slurm))
    assert (path, message) == ("faults[0].type", (
        f"disk_full: the job's directory {str(tmp_path)!r} is not on a shared mount of this "
        f"host, so the passthrough mounted there would not reach the slurm nodes, which "
        f"mount it themselves; the local Slurm test cluster makes its shared directory one "
        f"(scripts/slurm-cluster.sh up): run storage faults on nodes that see this host's "
        f"files there"))


def test_no_fuse_is_one_located_line_that_says_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import faultlab.faults.storage_io as storage_io

    monkeypatch.setattr(storage_io, "fuse_unavailable", lambda: "this machine has no /dev/fuse "
                        "(the FUSE kernel module is not loaded: `modprobe fuse` as root)")
    assert one_problem(doc(fault("type: io_hang")))[1:] == (
        "faults[0].type", "io_hang: cannot mount the storage passthrough: this machine has no "
                          "/dev/fuse (the FUSE kernel module is not loaded: `modprobe fuse` as "
                          "root)")


def test_propagation_is_read_from_the_mount_that_holds_the_path() -> None:
    mountinfo = (
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "42 27 254:0 /var/lib/faultlab-slurm/shared /var/lib/faultlab-slurm/shared rw "
        "shared:5 - ext4 /dev/vda rw\n"
        "43 27 254:0 /x /var/lib/faultlab-slurm/shared/private rw - ext4 /dev/vda rw\n")
    assert propagates(Path("/var/lib/faultlab-slurm/shared/runs/r1/job"), mountinfo)
    assert not propagates(Path("/var/lib/faultlab-slurm/shared/private/r1"), mountinfo)
    assert not propagates(Path("/tmp/runs"), mountinfo)


@pytest.mark.parametrize(("target", "served"), [
    (None, "checkpoints"),  # the reference trainer
    ("{command: [python, examples/fsdp2_dcp/train.py, --ckpt-dir, '{run_dir}/ckpt']}", "ckpt"),
    # a file argument: its directory
    ("{command: [python, examples/fsdp2_dcp/train.py, '--save-path={run_dir}/out/model.pt']}",
     "out"),
    # an argument name faultlab does not know, named by target.checkpoint_dir
    ("{command: [python, examples/fsdp2_dcp/train.py, --out, '{run_dir}/hf'], "
     "checkpoint_dir: '{run_dir}/hf'}", "hf"),
    # checkpoint_dir wins over a recognised argument
    ("{command: [python, examples/fsdp2_dcp/train.py, --ckpt-dir, '{run_dir}/ckpt'], "
     "checkpoint_dir: '{run_dir}/ckpt/rank0'}", "ckpt/rank0"),
])
def test_the_served_directory_is_the_jobs_checkpoint_directory(
        tmp_path: Path, target: str | None, served: str) -> None:
    from faultlab.engine.storage import storage_dir

    sections = {"target": f"target: {target}"} if target else {}
    exp = parse_experiment(doc(fault("type: disk_full"), **sections))
    assert storage_dir(exp, tmp_path) == tmp_path.resolve() / served


def test_a_storage_fault_on_a_directory_faultlab_cannot_know_is_refused_with_the_fix() -> None:
    """A Hugging Face-style --out {run_dir}/hf: faultlab used to mount {run_dir}/checkpoints,
    which the trainer never touched, and the fault struck nothing."""
    line, where, message = one_problem(doc(fault("type: disk_full"), target=(
        "target: {command: [python, examples/fsdp2_dcp/train.py, --out, '{run_dir}/hf']}")))
    assert where == "faults[0].type"
    assert message == (
        "disk_full: faultlab cannot tell which directory the trainer checkpoints to: no "
        "argument of target.command names one by a name it knows (--ckpt-dir, "
        "--checkpoint-dir, --save-dir, --output-dir, dirpath= ...) (the command's own "
        "{run_dir} argument: --out {run_dir}/hf); name it: target.checkpoint_dir: "
        "'{run_dir}/hf', and pass the same path to the trainer")
    # no {run_dir} argument at all: the example is the usual place
    assert one_problem(doc(fault("type: io_hang"), target=(
        "target: {command: [python, examples/fsdp2_dcp/train.py, --steps, '3']}")))[2].endswith(
        "name it: target.checkpoint_dir: '{run_dir}/checkpoints', and pass the same path to "
        "the trainer")


def test_a_fixed_checkpoint_path_is_never_mounted_over() -> None:
    assert one_problem(doc(fault("type: disk_full"), target=(
        "target: {command: [python, examples/fsdp2_dcp/train.py, --ckpt-dir, ckpt]}")))[1:] == (
        "faults[0].type", "disk_full: --ckpt-dir ckpt is a fixed checkpoint path shared by "
                          "every run, and faultlab never acts on a team's own checkpoints; write "
                          "--ckpt-dir {run_dir}/ckpt so each run's checkpoints are its own")


@pytest.mark.parametrize(("value", "why"), [
    ("hf", "'hf' is not inside each run's own directory"),
    ("/data/ckpt", "'/data/ckpt' is not inside each run's own directory"),
    ("{run_dir}x", "'{run_dir}x' is not inside each run's own directory"),
    ("{run_dir}/../elsewhere", "'{run_dir}/../elsewhere' is not inside each run's own"),
])
def test_checkpoint_dir_must_lie_in_the_run_directory(value: str, why: str) -> None:
    line, where, message = one_problem(doc(target=(
        f"target: {{command: [python, examples/fsdp2_dcp/train.py], checkpoint_dir: '{value}'}}")))
    assert where == "target.checkpoint_dir" and message.startswith(why), message


def test_checkpoint_dir_is_for_a_command_only() -> None:
    assert one_problem(doc(target="target: {checkpoint_dir: '{run_dir}/x'}"))[1:] == (
        "target.checkpoint_dir", "checkpoint_dir is for your own trainer (command); the "
                                 "reference trainer's is {run_dir}/checkpoints")
