"""Each node's exit code of a Slurm job, read from what ``srun`` said of its tasks in the batch
output (``faultlab.targets.slurm.exits``): the texts are Slurm 22.05's, as the local test
cluster writes them (tests/slurm runs the real thing: an unfaulted node's non-zero exit fails
``completes``, named)."""

from __future__ import annotations

from faultlab.targets.slurm.exits import node_exits

HOSTLISTS = {"node[1-2]": ["node1", "node2"], "node[2-3]": ["node2", "node3"],
             "node[1,3]": ["node1", "node3"]}


def expand(hosts: str) -> list[str]:
    return HOSTLISTS[hosts]


def own(output: str) -> dict[str, int | None] | None:
    return node_exits(output, nodes=["node9"], own_script=True, ended_alone=False,
                      expand=expand)


def test_faultlabs_script_gives_every_node_of_the_last_incarnation_its_code() -> None:
    out = """\
faultlab: job 12 restart 0 on node[1-2] at 1700000000.1
faultlab node node1: job 12 restart 0: ...
srun: error: node2: task 1: Killed
faultlab: srun exited 137 at 1700000010.0
faultlab: job 12 restart 1 on node[1,3] at 1700000030.5
srun: error: node3: task 1: Exited with exit code 3
faultlab: srun exited 3 at 1700000060.0
"""
    # the first incarnation (killed by the requeue) counts no more; node1 said nothing: 0
    assert own(out) == {"node1": 0, "node3": 3}


def test_while_srun_runs_a_node_is_unknown_unless_it_has_exited() -> None:
    out = ("faultlab: job 12 restart 0 on node[1-2] at 1.0\n"
           "srun: error: node2: task 1: Exited with exit code 1\n")
    assert own(out) == {"node1": None, "node2": 1}
    out += ("slurmstepd: error: *** STEP 12.0 ON node1 CANCELLED AT 2026-12-02T03:00:00 ***\n"
            "srun: error: node1: task 0: Terminated\n")
    assert own(out) == {"node1": -15, "node2": 1}
    assert own("no mark of faultlab's script\n") is None


def test_signals_core_dumps_and_host_lists() -> None:
    out = ("faultlab: job 5 restart 0 on node[1-2] at 1.0\n"
           "srun: error: node[1-2]: tasks 0-1: Segmentation fault (core dumped)\n"
           "faultlab: srun exited 139 at 2.0\n")
    assert own(out) == {"node1": -11, "node2": -11}


def test_a_teams_script_is_told_apart_only_when_it_ran_once_and_ended_by_itself() -> None:
    out = "step 16 loss 2.1\nsrun: error: node2: task 1: Exited with exit code 3\n"

    def team(ended_alone: bool) -> dict[str, int | None] | None:
        return node_exits(out, nodes=["node1", "node2"], own_script=False,
                          ended_alone=ended_alone, expand=expand)

    assert team(True) == {"node1": 0, "node2": 3}
    assert team(False) is None  # requeued, or cancelled: the job's one code stands
