"""The storage faults' YAML (issue 23): what loads, and one located line per mistake."""

from __future__ import annotations

import pytest

from faultlab.faults.storage_io import IoErrorFault
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


def test_a_storage_fault_must_be_undone_and_is_refused_on_slurm() -> None:
    hang = "- {type: io_hang, target: all, trigger: {at_step: 5}}"
    assert one_problem(doc(hang))[1:] == (
        "faults[0]", "io_hang must be undone: add duration_s: <seconds>, until: reaction, or "
                     "both (whichever comes first)")
    assert parse_experiment(doc(fault("type: disk_full"), topology=(
        "topology: {nodes: 2, procs_per_node: 1, launcher: docker}"))).faults
    line, path, message = one_problem(doc(fault("type: disk_full"), topology=(
        "topology: {nodes: 2, procs_per_node: 1, launcher: slurm, slurm: {time_limit: "
        "'10:00'}}")))
    assert (path, message) == ("faults[0].type", (
        "disk_full needs topology.launcher: local or docker (this experiment's nodes are "
        "'slurm'): the FUSE passthrough is mounted on faultlab's host, and a Slurm job's nodes "
        "see the shared directory through mounts of their own, which it does not reach; run "
        "storage faults on local or docker nodes"))


def test_no_fuse_is_one_located_line_that_says_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import faultlab.faults.storage_io as storage_io

    monkeypatch.setattr(storage_io, "fuse_unavailable", lambda: "this machine has no /dev/fuse "
                        "(the FUSE kernel module is not loaded: `modprobe fuse` as root)")
    assert one_problem(doc(fault("type: io_hang")))[1:] == (
        "faults[0].type", "io_hang: cannot mount the storage passthrough: this machine has no "
                          "/dev/fuse (the FUSE kernel module is not loaded: `modprobe fuse` as "
                          "root)")
