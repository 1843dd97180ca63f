"""The shipped experiments of examples/: trainers written the way their authors write them, that
import nothing of faultlab, broken at integration level 0. Each experiment's real outcome is
asserted, failures included: where a trainer genuinely fails an SLA (no checkpoint integrity
check, no non-finite check, no watchdog), the failure and its message are the expected result.

- ``fsdp2_dcp``: a plain torchrun FSDP2 + DCP script.
- ``lightning_ddp``: a PyTorch Lightning trainer (DDP on CPU, gloo; its own ``ModelCheckpoint``
  and ``fit(ckpt_path="last")``), from the ``examples`` extra.
- ``nvrx_ft``: the ``fsdp2_dcp`` work with NVIDIA Resiliency Extension's heartbeats, run under
  the team's own ``ft_launcher`` line (``nvidia-resiliency-ext`` 0.4.1, the ``examples`` extra).
- ``nondeterministic``: the ``fsdp2_dcp`` script with an LR schedule and noise from
  ``os.urandom`` in every update (a GPU trainer's run-to-run differences, on a CPU), judged by
  ``matches_golden_within_noise``; once with a correct resume, once forgetting its LR schedule.
- ``silent_ddp``: plain DDP on 3 replicas with silent-failure monitors of its own (a
  cross-replica fingerprint, a loss spike rule, a compute-time straggler score, a same-device
  replay), each printing a line its experiment declares as a detection signal; judged by the
  detection SLAs against ``sdc`` and ``gpu_slow``, the monitors' misses included.
- ``torchft_ddp``: torchft's DDP (``Manager``, ``DistributedDataParallel``, ``Optimizer``,
  ``ProcessGroupGloo``), its lighthouse as a service and one torchrun per replica group, from
  the ``examples`` extra.

One table of scenarios, one runner (faultlab's engine, as ``faultlab run`` uses it); on a
mismatch the assertion shows the whole SLA table and the job's exit codes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pytest_faultlab._items import hang_guard_s

from faultlab.cli import EXIT_FAIL, EXIT_INCONCLUSIVE
from faultlab.engine import run_experiment
from faultlab.engine.campaign import run_campaign
from faultlab.runtime.events import read_events
from faultlab.spec import load_campaign, load_experiment
from faultlab.testing import require_docker_engine

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXPERIMENTS = EXAMPLES / "fsdp2_dcp" / "experiments"


@dataclass(frozen=True)
class Expected:
    verdict: str
    failing: dict[str, str] = field(default_factory=dict)
    """SLA → a piece of its note that the failure must carry."""
    measured: dict[str, object] = field(default_factory=dict)
    """SLA → its exact measured value."""
    notes: dict[str, str] = field(default_factory=dict)
    """SLA (passed or not) → a piece of its note."""
    inconclusive: dict[str, str] = field(default_factory=dict)
    """SLA not measured for want of a reference → a piece of its note (what to add)."""
    unless: Branch | None = None
    """Another outcome the stack under test chooses by its own timing, and when."""
    detected: dict[str, bool] = field(default_factory=dict)
    """Declared detection signal → whether it detected the fault (the journal's
    ``detection.signals``): a monitor's miss, where the SLAs count only another's."""


@dataclass(frozen=True)
class Branch:
    """What the stack does instead when a condition read from the run's own records holds: a
    race between its configured timers and its restarts, which a slower machine decides the
    other way. The test says which branch the run took and asserts that branch's outcome,
    rather than flip between machines."""

    why: str
    applies: Callable[[dict[str, Any], list[dict[str, Any]]], bool]
    """``(journal, events) -> bool``."""
    expected: Expected


def _thawed_group_failed(journal: dict[str, Any], events: list[dict[str, Any]]) -> bool:
    """A rank of the frozen node ended in an error after the freeze was lifted: torchft's own
    fork, read from the job's exit records (not from the verdict under test)."""
    [fault] = journal["faults"]
    [spec] = journal["experiment"]["document"]["faults"]
    node = fault["details"]["node"]
    thawed_t = fault["injected_t"] + float(spec["duration_s"])
    return any(e.get("kind") == "exit" and e.get("node") == node and e["t"] >= thawed_t
               and e.get("reason") != "completed" for e in events)


SCENARIOS = {
    "fsdp2_dcp/rank_kill.yaml": Expected("pass", measured={
        "bitwise_equal_to_golden": True, "max_restarts": 1, "completes": True}),
    "fsdp2_dcp/node_loss.yaml": Expected("pass", measured={"completes": True}),
    # The same node loss under the team's own plain torchrun line: the job finishes, but only
    # after torchrun's last call (30 s) and keep-alive (3 x 5 s): 49.4 s here (the issue
    # measured 45.4 s), against 6-11 s under faultlab's launcher. The verdict names the flag.
    "fsdp2_dcp/node_loss_torchrun.yaml": Expected("fail", failing={
        "resume_time_s": "to change it: --rdzv-conf last_call_timeout=1,keep_alive_interval=1,"
                         "keep_alive_max_attempt=3"},
        measured={"completes": True}),
    # Node 0's agent hosted the c10d store: its loss takes the job (the survivor's agent fails
    # with RendezvousConnectionError), where faultlab's launcher shrinks and finishes.
    "fsdp2_dcp/node0_loss_torchrun.yaml": Expected("fail", failing={
        "completes": "the c10d rendezvous store lived in node0's torchrun agent",
        "resume_time_s": "node0's loss took the store", "lost_steps": "node0's loss took"},
        measured={"completes": False}),
    # torchrun with its rendezvous in etcd (a service, outside the nodes) and the recommended
    # --rdzv-conf: no store dies with node 0; the survivor resumes alone (6.3 s in the
    # benchmark's first round, where plain torchrun lost the job).
    "fsdp2_dcp/node0_loss_etcd.yaml": Expected("pass", measured={"completes": True,
                                                                 "lost_steps": 1}),
    # The same loss with each node a container (tests/docker's engine): the team's line runs
    # inside every one, its endpoint node 0's name; the store goes with node 0's container.
    "fsdp2_dcp/docker_node0_loss_torchrun.yaml": Expected("fail", failing={
        "completes": "the c10d rendezvous store lived in node0's torchrun agent",
        "resume_time_s": "node0's loss took the store", "lost_steps": "node0's loss took"},
        measured={"completes": False}),
    "fsdp2_dcp/ckpt_bitflip.yaml": Expected("fail", failing={
        "corrupt_checkpoint_never_loaded": "(step 8) after rot (ckpt_bitflip) damaged "
                                           "checkpoints/step_8/"}),
    "fsdp2_dcp/grad_nan.yaml": Expected("fail", failing={
        "detection_latency_s": "the job never noticed the fault",
        "bitwise_equal_to_golden": "first differing tensor: model."},
        measured={"completes": True}),
    "fsdp2_dcp/collective_hang.yaml": Expected("fail", failing={
        "detection_latency_s": "the job never noticed the fault"},
        measured={"completes": True}),
    # DCP raises CheckpointException on both ranks and the script has no handler: the failed
    # save is noticed by dying; the partial step_12 (no .metadata) is never loaded; torchrun
    # restarts it from step_8 and it ends bitwise equal, but nothing trained on through it.
    "fsdp2_dcp/disk_full.yaml": Expected("fail", failing={
        "training_continued_through_save_failure": "the job was restarted after it"},
        measured={"completes": True, "bitwise_equal_to_golden": True,
                  "save_failure_detected": True, "failed_save_never_loaded": True}),
    # A campaign at level 0: the NaN gradient among its faults is never noticed.
    # On the step clock, its scoring is the same every run: 2 of 4 detected (the io_error is
    # beaten to its save by a kill, compound), both attributed.
    "fsdp2_dcp/campaign.yaml": Expected("fail", failing={"detection_rate": ""}, measured={
        "completes": True, "false_positives_per_hour": 0.0, "detection_rate": 0.5,
        "attribution_accuracy": 1.0}),
    # Node 1 comes back on the same machine, its NFS client's listing of checkpoints/ from
    # before node 0 saved step 12: each rank picks the newest checkpoint it sees, so node 1's
    # rank loads step 8 and node 0's step 12. Rank 0 finishes first and rank 1, alone again,
    # trains steps 9-20 a second time from step 8: both "complete".
    "fsdp2_dcp/stale_shared_fs.yaml": Expected("fail", failing={
        "same_resume_point": "step 8 on node1 (rank"}, measured={"completes": True}),
    # A GPU that stays lost (sticky Xid 79): torchrun restarts in place on it until its
    # restarts are spent, and never goes on without the node. The launcher decides this, not
    # the trainer: the same experiment on the Lightning example (removed to keep the suite's
    # CPU budget) ended the same way in 20 of 20 soak runs (docs/results/soak.md).
    "fsdp2_dcp/gpu_error_sticky.yaml": Expected("fail", failing={
        "completes": "", "faulty_node_excluded": "the job never ran without node1",
        "restarts_until_excluded": "2 restart(s) used"}, measured={"completes": False}),
    "lightning_ddp/rank_kill.yaml": Expected("pass", measured={
        "bitwise_equal_to_golden": True, "max_restarts": 1, "completes": True}),
    "lightning_ddp/node_loss.yaml": Expected("pass", measured={"completes": True}),
    # torch.load checks no CRC and Lightning no checksum: resumed from the rotten last.ckpt.
    "lightning_ddp/ckpt_bitflip.yaml": Expected("fail", failing={
        "corrupt_checkpoint_never_loaded": "/checkpoints/last.ckpt (step 8) after rot "
                                           "(ckpt_bitflip) damaged checkpoints/last.ckpt at "
                                           "offset "}),
    # No non-finite check by default: the NaN reaches the weights and the optimizer state.
    "lightning_ddp/grad_nan.yaml": Expected("fail", failing={
        "detection_latency_s": "the job never noticed the fault",
        "bitwise_equal_to_golden": "first differing tensor: optimizer_states.0.state."},
        measured={"completes": True}),
    # Lightning's save moves a temporary file from /tmp over last.ckpt: across file systems a
    # copy that truncates it first. ENOSPC tears it, and every restart dies loading it.
    "lightning_ddp/disk_full.yaml": Expected("fail", failing={
        "completes": "PytorchStreamReader failed reading zip archive",
        "training_continued_through_save_failure": "the job was restarted after it"},
        measured={"save_failure_detected": True, "failed_save_never_loaded": True}),
    "lightning_ddp/collective_hang.yaml": Expected("fail", failing={
        "detection_latency_s": "the job never noticed the fault"},
        measured={"completes": True}),
    # NVRx's straggler scoring as the trainer's monitor: asserted with its log lines in
    # test_nvrx_scoring_names_the_slow_rank (SHOWN_BY_MONITOR_TEST).
    "nvrx_straggler/gpu_slow.yaml": Expected("pass", measured={
        "completes": True, "max_restarts": 0}),
    # ft_launcher restarts the worker group in place; the trainer resumes from step 8.
    "nvrx_ft/rank_kill.yaml": Expected("pass", measured={
        "bitwise_equal_to_golden": True, "max_restarts": 1, "completes": True}),
    # A SIGSTOPped rank: the trainer never notices, NVRx's heartbeat timeout (5 s) does: its rank
    # monitor kills the rank and ft_launcher restarts the group (detected 5.7 s after the stop).
    "nvrx_ft/rank_hang.yaml": Expected("pass", measured={
        "bitwise_equal_to_golden": True, "max_restarts": 1, "completes": True}),
    # ft_launcher keeps torchrun's store layout: node 0's agent hosts it, and its loss takes the
    # job (node 1's agent fails with RendezvousConnectionError 3.6 s after the kill).
    "nvrx_ft/node0_loss.yaml": Expected("fail", failing={
        "completes": "the c10d rendezvous store lived in node0's ft_launcher agent",
        "resume_time_s": "node0's loss took the store", "lost_steps": "node0's loss took"},
        measured={"completes": False}),
    # Two fault-free runs differ (noise from os.urandom): bitwise is not measured, and the
    # measured noise verdict covers it; the correct resume stays within 10x the run-to-run
    # spread (1.0-4.0x in 8 runs
    # with fresh golden runs here). Which step they first differ at is the draw's: step 2
    # mostly, step 3 when step 1's perturbation (1e-5 of the weights) left step 2's float32
    # loss unchanged (seen once, in a run beside two busy loops), so the note's step is not
    # pinned here.
    "nondeterministic/rank_kill.yaml": Expected("pass", measured={
        "completes": True, "max_restarts": 1, "bitwise_equal_to_golden": None}, notes={
        "bitwise_equal_to_golden": "not measured: two fault-free runs differ from step ",
        "matches_golden_within_noise": "within "}),
    # The resume that forgets its LR schedule (torchtitan#4598's bug): bitwise cannot see it on
    # this trainer; the noise verdict fails, naming the step it left the envelope (2,600-8,600x
    # in 3 runs).
    "nondeterministic/stale_lr_schedule.yaml": Expected("fail", failing={
        "matches_golden_within_noise": "left the noise envelope at step 11"}, measured={
        "completes": True, "max_restarts": 1, "bitwise_equal_to_golden": None}),
    # torchft: the killed group restarts under its torchrun and heals from its peer's live
    # state at the next step (step 11, 1.9 s after the kill here); the survivor keeps its
    # process and loses no step; from the heal on both hold bitwise the same weights.
    "torchft_ddp/rank_kill.yaml": Expected("pass", measured={
        "completes": True, "survivor_restarts": 0, "survivor_lost_steps": 0,
        "healed_by_step": 11, "healed_state_matches_peer": True}),
    # A group frozen for 6 s: the survivor waits for a quorum of 2 (min_replicas), the group
    # comes back at step 11 with the same weights as its peer.
    "torchft_ddp/group_hang.yaml": Expected("pass", measured={
        "completes": True, "survivor_restarts": 0, "survivor_lost_steps": 0,
        "healed_by_step": 11, "healed_state_matches_peer": True}),
    # The same group frozen for 15 s, longer than the 10 s quorum timeout: the group NOT hit
    # fails its quorum and restarts (twice here: its new process first fails to build the
    # process group with the still-frozen peer); the hung group heals 19.2-19.6 s after the
    # fault, within the freeze and a cold start. torchft's promise that the others step on
    # holds only for a hang shorter than it.
    # Unless the thawed group fails its own quorum once continued (seen capped at 1 CPU beside
    # two busy loops, where the survivor's restart took 12 s): then it finds no peer
    # (AssertionError in its quorum), and both start over from step 1: 10 steps lost, no heal.
    # When the survivor is back does not decide it by itself: idle, its new process was
    # created 2 s before the thaw, reached main 0.01 s after it, and the thawed group healed.
    "torchft_ddp/group_hang_long.yaml": Expected("fail", failing={
        "survivor_restarts": "rank(s) 0 (not struck) restarted"},
        notes={"heal_time_s": "rank 1 healed at step 11"},
        measured={"completes": True, "survivor_lost_steps": 0,
                  "healed_state_matches_peer": True},
        unless=Branch(
            "the frozen group failed its quorum once continued: it found no peer, and both "
            "started over",
            _thawed_group_failed,
            Expected("fail", failing={
                "survivor_restarts": "rank(s) 0 (not struck) restarted",
                "survivor_lost_steps": "started over instead of healing from a peer",
                "healed_by_step": "started over instead of healing from a peer",
                "heal_time_s": "started over instead of healing from a peer"},
                inconclusive={"healed_state_matches_peer": "started over"},
                measured={"completes": True, "survivor_lost_steps": 10}))),
    # The lighthouse computes every quorum: killed, both groups stall for the quorum timeout,
    # fail, and every restart fails to connect to it; the job is lost and the verdict names it.
    "torchft_ddp/lighthouse_kill.yaml": Expected("fail", failing={
        "completes": "the job depended on its service 'lighthouse'",
        "survivor_restarts": "the job depended on its service 'lighthouse'",
        "survivor_lost_steps": "rank 0 (not struck) made no step after the fault"},
        measured={"completes": False, "survivor_restarts": 2}),
    # examples/silent_ddp: one trainer command for all five, so their two fault-free runs
    # are measured once. An update sdc from step 5: rank 1's replica leaves the others, and
    # the fingerprint of step 8 names it; the 10x spike rule notices nothing.
    "silent_ddp/sdc_update.yaml": Expected("pass", measured={
        "completes": True, "detected_within_steps": 3, "detection_attributed": True,
        "false_alarms": 0}, detected={"fingerprint": True, "spike": False}),
    # The same sdc on the gradient: the all-reduce averages it into every replica. No monitor
    # notices; the weights leave the fault-free runs' noise (118 times it here).
    "silent_ddp/sdc_gradient.yaml": Expected("fail", failing={
        "detected_within_steps": "not detected by fingerprint, replay, spike: sdc-gradient "
                                 "(sdc) on rank 1's gradient from step 5",
        "matches_golden_within_noise": "times the noise ("},
        measured={"completes": True, "false_alarms": 0},
        detected={"fingerprint": False, "replay": False, "spike": False}),
    # Intermittent (seeded), the replay's two gradients of step 8 differ on rank 1.
    "silent_ddp/replay_intermittent.yaml": Expected("pass", measured={
        "completes": True, "detected_within_steps": 3, "detection_attributed": True,
        "false_alarms": 0}, detected={"replay": True, "fingerprint": False}),
    # 3x: rank 1's score about 0.35, named after 3 steps in a row below 0.75 (its median over
    # 7 steps first needs 4 slow ones): at step 11 or 12.
    "silent_ddp/slow_rank_3x.yaml": Expected("pass", measured={
        "completes": True, "detection_attributed": True, "false_alarms": 0},
        detected={"straggler": True}),
    # 1.2x: its score 0.80-0.86, above the threshold: not named. Injected at step 5's gate,
    # the first slowed step is 6 (gpu_slow's fault_struck record of its episode).
    "silent_ddp/slow_rank_1_2x.yaml": Expected("fail", failing={
        "detected_within_steps": "not detected by straggler: slow-rank-1 (gpu_slow) on rank 1 "
                                 "from step 6"}, measured={"completes": True, "false_alarms": 0},
        detected={"straggler": False}),
    # examples/plugin, a team's own fault and SLA (make installs the package): rank 1 raises in
    # its optimizer step (at step 15 on the reference trainer, 6 at level 0), its peer leaves
    # its collective (0.03 s on the reference trainer, 1.02 s at level 0 here), the group
    # restarts from the last checkpoint, bitwise equal.
    "plugin/optimizer_exception_reference.yaml": Expected("pass", measured={
        "completes": True, "max_restarts": 1, "bitwise_equal_to_golden": True}),
    "plugin/optimizer_exception_fsdp2_dcp.yaml": Expected("pass", measured={
        "completes": True, "max_restarts": 1, "bitwise_equal_to_golden": True}),
    # examples/plugin's own target (netns): node 2 of 3 cut off in its network namespace at
    # step 9; the watchdog restarts the others, who go on alone from the step-6 checkpoint.
    "plugin/network_partition_netns.yaml": Expected("pass", measured={
        "completes": True, "max_restarts": 1, "samples_exactly_once": True, "lost_steps": 3,
        "fault_landed_at_step[cut-node-2]": 9}),
}


SHOWN_ON_SLURM = {"fsdp2_dcp/rank_kill.yaml": "slurm_rank_kill.yaml"}
"""Examples whose run here would only repeat a shipped Slurm experiment that CI runs
(tests/slurm): the same trainer, fault, schedule and expectations, on Slurm nodes. The local
launcher with a team's own command is what every other example here runs."""


SHOWN_WITH_FIX = {
    "fsdp2_dcp/node0_loss_torchrun.yaml": ("store_lost", "is_host=false"),
    "fsdp2_dcp/node_loss_torchrun.yaml": ("slow_rendezvous", "last_call_timeout=1"),
}
"""Examples run by ``faultlab run --with-fix`` (test_with_fix_turns_the_finding_into_a_pass):
the team's run, asserted as its scenario says, then the same experiment with its finding's
fix: the cause, and a piece of the fixed line."""


SHOWN_WITH_BAR = {"silent_ddp/sdc_update.yaml"}
"""Examples run by ``faultlab run --bar`` (test_bar_sets_the_teams_monitors_beside_the_bars):
the team's run, asserted as its scenario says, then the same faults on the reference trainer
with its bar monitors on, and the table that sets the two side by side."""

SHOWN_BY_MONITOR_TEST = {"nvrx_straggler/gpu_slow.yaml"}
"""Examples whose monitor's own lines are asserted too (test_nvrx_scoring_names_the_slow_rank)."""

SHOWN_BY_PLUGIN_TEST = {name for name in SCENARIOS if name.startswith("plugin/")}
"""Examples run by tests/plugin/test_example_plugin_e2e.py, which asserts their scenario here
and what else they show of the team's fault and SLA (the SLA's measured value and note, the
report, the listings and the reference)."""


def _bitwise_alone(doc: dict[str, Any]) -> None:
    doc["golden"] = {"runs": 2}
    doc["expect"] = {k: v for k, v in doc["expect"].items()
                     if k != "matches_golden_within_noise"}


def _nan_after_restart(doc: dict[str, Any]) -> None:
    doc["faults"].append({"id": "nan-after-restart", "type": "grad_nan",
                          "target": {"rank": 0}, "trigger": {"at_step": 12}})


@dataclass(frozen=True)
class Variant:
    """A shipped example with one change, run end to end the way a team would."""

    example: str
    """The scenario it changes (its golden runs are that scenario's: same trainer, topology
    and steps, so the golden cache serves both)."""
    change: Any
    """Edits the experiment document in place."""
    via: str
    """``faultlab run``: the CLI, in this process; ``pytest``: the plugin, as an item of a
    pytest run of its own (its journal then re-rendered by ``faultlab report``)."""
    exit_code: int
    expected: Expected


VARIANTS = {
    # Issue 53: bitwise alone on a trainer whose two fault-free runs differ passed whatever
    # its resume did (this one restarts its LR schedule at step 0). Inconclusive now, in the
    # plugin's item, the journal, the report and the CLI's exit code.
    "stale_lr_schedule, bitwise alone": Variant(
        "nondeterministic/stale_lr_schedule.yaml", _bitwise_alone, "pytest", EXIT_INCONCLUSIVE,
        Expected(
            "inconclusive", inconclusive={
                "bitwise_equal_to_golden": "add matches_golden_within_noise: true"},
            measured={"completes": True, "max_restarts": 1,
                      "bitwise_equal_to_golden": None})),
    # Issue 53: a grad_nan after the restart printed loss nan at steps 13 to 16, and the run
    # passed "within 2.40 times the noise". The first NaN step fails it now.
    "rank_kill, NaN after its restart": Variant(
        "nondeterministic/rank_kill.yaml", _nan_after_restart, "faultlab run", EXIT_FAIL,
        Expected(
            "fail", failing={
                "matches_golden_within_noise": "this run's loss is nan at step 13"},
            measured={"completes": True, "max_restarts": 1,
                      "bitwise_equal_to_golden": None})),
}
"""Shipped examples changed in one place (``change``), each asserted like a scenario."""


def test_every_shipped_example_experiment_has_its_outcome_here() -> None:
    shipped = {f"{p.parent.parent.name}/{p.name}" for p in EXAMPLES.glob("*/experiments/*.yaml")}
    assert shipped == set(SCENARIOS)
    assert {v.example for v in VARIANTS.values()} <= set(SCENARIOS)


@pytest.mark.parametrize("name", sorted(SHOWN_ON_SLURM))
def test_an_example_left_to_slurm_is_that_slurm_experiment_on_local_nodes(name: str) -> None:
    local = load_experiment(EXAMPLES / name.replace("/", "/experiments/"))
    slurm = load_experiment(EXAMPLES.parent / "experiments" / SHOWN_ON_SLURM[name])
    assert slurm.topology.launcher == "slurm" and local.topology.launcher == "local"
    # launch: on Slurm the batch script starts the nodes; locally the example names its line
    # On Slurm the team's entry point names the run after its allocation and runs the same
    # train.py with the same arguments (examples/slurm/train_entry.py).
    entry = ("python", "examples/slurm/train_entry.py")
    assert slurm.target.command is not None and slurm.target.command[:2] == entry
    command = ("python", "examples/fsdp2_dcp/train.py", *slurm.target.command[2:])
    assert (local.target.model_copy(update={"launch": None}), local.run, local.observe,
            local.faults, local.expect) == \
        (slurm.target.model_copy(update={"command": command}), slurm.run, slurm.observe,
         slurm.faults, slurm.expect)
    assert (local.topology.nodes, local.topology.max_restarts) == \
        (slurm.topology.nodes, slurm.topology.max_restarts)
    assert SCENARIOS[name].verdict == "pass"  # tests/slurm asserts that the Slurm run passes


def guarded(names: set[str], *, runs: int = 1) -> list[object]:
    """Each example as a parameter with its hang guard: pytest-timeout at what its own
    ``run.timeout_s`` bounds (``hang_guard_s``: each run and golden run), not the suite's
    120 s for unit tests, which a job with a golden run meets on a machine half as fast."""
    out = []
    for name in sorted(names):
        path = EXAMPLES / name.replace("/", "/experiments/")
        campaign = load_campaign(path)
        doc = campaign[0] if campaign else load_experiment(path)
        out.append(pytest.param(name, marks=pytest.mark.timeout(hang_guard_s(
            doc, runs=runs, campaign=campaign is not None))))
    return out


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("name", guarded(set(SCENARIOS) - set(SHOWN_ON_SLURM)
                                         - set(SHOWN_WITH_FIX) - SHOWN_BY_PLUGIN_TEST
                                         - SHOWN_BY_MONITOR_TEST - SHOWN_WITH_BAR))
def test_shipped_experiment_outcome(name: str, tmp_path: Path, golden_cache: Path) -> None:
    expected = SCENARIOS[name]
    path = EXAMPLES / name.replace("/", "/experiments/")
    campaign = load_campaign(path)
    if campaign is not None:  # scored, its campaign SLAs judged with the others
        result = run_campaign(campaign[0], source=path, line=campaign[1],
                              report_dir=tmp_path, golden_cache=golden_cache).result
    else:
        exp = load_experiment(path)
        if exp.topology.launcher == "docker":  # skips without an engine, fails in CI
            require_docker_engine()
        result = run_experiment(exp, report_dir=tmp_path, golden_cache=golden_cache)
    branch = expected.unless
    journal = json.loads(result.journal_path.read_text())
    if branch is not None and branch.applies(
            journal, read_events(Path(journal["run"]["job_dir"]) / "events")):
        print(f"{name}: the other branch: {branch.why}")
        expected = branch.expected
    where = f"error: {result.error}\njournal: {result.journal_path}"
    _check(expected, result.verdict, [s.to_dict() for s in result.slas], where)
    if expected.detected:
        signals = {s["name"]: s for s in journal["detection"]["signals"]}
        assert {n: signals[n]["detected"] for n in expected.detected} == expected.detected, \
            f"{journal['detection']}\n{where}"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("name", guarded(SHOWN_BY_MONITOR_TEST))
def test_nvrx_scoring_names_the_slow_rank(name: str, tmp_path: Path, golden_cache: Path) -> None:
    """NVRx 0.4.1's ReportGenerator and Report.identify_stragglers, unchanged, on CPU: each of
    its reports from step 20 on (15 too unless the strike came late) names rank 1 and no other,
    under its 0.75 threshold. Its reports before the strike (steps 5 and 10) are not asserted:
    under the suite's load (three workers on 2 cores) its rule, on a 5-step median of a tiny
    model's forward, named a fault-free rank at step 5 (score 0.587) in one run of the suite,
    a false alarm of the monitor on this machine, not of faultlab's."""
    result = run_experiment(load_experiment(EXAMPLES / name.replace("/", "/experiments/")),
                            report_dir=tmp_path, golden_cache=golden_cache)
    _check(SCENARIOS[name], result.verdict, [s.to_dict() for s in result.slas],
           f"error: {result.error}\njournal: {result.journal_path}")
    journal = json.loads(result.journal_path.read_text())
    logs = "".join(p.read_text() for p in sorted(
        (Path(journal["run"]["job_dir"]) / "logs").glob("*.log")))
    named = re.findall(r"NVRx straggler: rank (\d+) \(node (\S+)\) section forward relative "
                       r"score (\S+) at step (\d+)", logs)
    # faultlab strikes once it reads "step 10" in the log, a step or two later on a busy
    # machine: the report at step 15 (the median of steps 11-15) may still be clean
    after = [n for n in named if int(n[3]) >= 15]
    steps = [int(step) for _r, _n, _score, step in after]
    assert steps in ([15, 20, 25, 30], [20, 25, 30]), logs[-3000:]
    assert {(r, node) for r, node, _score, _step in after} == {("1", "node1")}, logs[-3000:]
    assert all(float(score) < 0.75 for _r, _n, score, _s in after)


def _check(expected: Expected, verdict: str, rows: list[dict[str, Any]], where: str) -> None:
    """One run's verdict and SLA rows (``SLAResult.to_dict``, as the journal keeps them)
    against its scenario; on a mismatch the whole table."""
    table = "\n".join(f"{r['name']}: {r['result']}, measured {r['measured']!r}, bound "
                      f"{r['bound']!r} ({r['note']})" for r in rows) + "\n" + where
    assert verdict == expected.verdict, table
    slas = {r["name"]: r for r in rows}
    assert {n for n, r in slas.items() if r["result"] == "fail"} == set(expected.failing), table
    assert {n for n, r in slas.items() if r["result"] == "inconclusive"} == \
        set(expected.inconclusive), table
    for sla, piece in {**expected.failing, **expected.inconclusive, **expected.notes}.items():
        assert piece in slas[sla]["note"], table
    for sla, value in expected.measured.items():
        assert slas[sla]["measured"] == value, table
    assert all(r["passed"] for n, r in slas.items() if n.startswith("fault_injected")), table


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_outcome(name: str, tmp_path: Path, golden_cache: Path) -> None:

    import yaml

    from faultlab.cli import main

    variant = VARIANTS[name]
    doc = yaml.safe_load((EXAMPLES / variant.example.replace("/", "/experiments/"))
                         .read_text())
    variant.change(doc)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    reports = tmp_path / "reports"
    if variant.via == "pytest":
        _run_as_pytest_item(path, reports, golden_cache, variant.expected)
        [folder] = [p.parent for p in reports.glob("*/journal.json")]
        code = main(["report", str(folder)])  # the CLI's verdict of that run
    else:
        code = main(["run", "--report-dir", str(reports), "--golden-cache", str(golden_cache),
                     str(path)])
        [folder] = [p.parent for p in reports.glob("*/journal.json")]
    journal = json.loads((folder / "journal.json").read_text())
    _check(variant.expected, journal["verdict"], journal["slas"], f"journal: {folder}")
    assert code == variant.exit_code, journal["verdict"]
    report = (folder / "report.md").read_text()
    assert report.startswith(f"# {doc['name']}: {variant.expected.verdict.upper()}\n")
    for sla in variant.expected.inconclusive:
        assert f"| {sla} | yes | not measured (" in report, report
        assert "| **INCONCLUSIVE** |" in report and "**Inconclusive:** nothing failed" in report


def _run_as_pytest_item(path: Path, reports: Path, golden_cache: Path,
                        expected: Expected) -> None:
    """``path`` as an item of a pytest run of its own (the plugin), from the repository root
    like this one (the golden runs' key holds the working tree's git state): the item fails,
    its head line says why, and JUnit XML carries the verdict and each SLA's result."""
    import os
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    from pytest_faultlab.plugin import INCONCLUSIVE

    junit = reports / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", str(path), "-p", "no:cacheprovider", "-q",
         f"--faultlab-report-dir={reports}", f"--faultlab-golden-cache={golden_cache}",
         f"--junitxml={junit}"], cwd=EXAMPLES.parent, env=env, capture_output=True,
        text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text  # pytest's "some tests failed"
    names = ", ".join(expected.inconclusive)
    assert INCONCLUSIVE.format(name=_name_of(path), names=names) in text, text
    assert "Traceback" not in text, text
    [case] = list(ET.parse(junit).getroot().iter("testcase"))
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["faultlab.verdict"] == expected.verdict, props
    for sla in expected.inconclusive:
        assert props[f"faultlab.sla.{sla}.result"] == "inconclusive", props


def _name_of(path: Path) -> str:
    import yaml

    return str(yaml.safe_load(path.read_text())["name"])


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("name", guarded(set(SHOWN_WITH_FIX), runs=2))  # the team's, the fix's
def test_with_fix_turns_the_finding_into_a_pass(name: str, tmp_path: Path,
                                                golden_cache: Path) -> None:
    """Issue 38's proof: the team's plain torchrun line fails as its scenario says, and the same
    experiment with the fix its finding prints (applied to target.launch and target.services
    by --with-fix) passes. The exit code stays the team's run's."""
    import re

    from faultlab.cli import EXIT_FAIL, main

    cause, piece = SHOWN_WITH_FIX[name]
    code = main(["run", "--with-fix", "--report-dir", str(tmp_path), "--golden-cache",
                 str(golden_cache), str(EXAMPLES / name.replace("/", "/experiments/"))])
    [fix_md] = list(tmp_path.glob("*/fix.md"))
    text = fix_md.read_text()
    team = json.loads((fix_md.parent / "journal.json").read_text())
    fixed_dir = re.search(r"the fixed run: `([^`]+)`", text)
    assert fixed_dir is not None, text
    fixed = json.loads((Path(fixed_dir.group(1)) / "journal.json").read_text())
    expected = SCENARIOS[name]
    table = "\n".join(f"{s['name']} {s['passed']} {s['measured']} {s['note']}"
                      for s in team["slas"]) + "\n" + text
    assert code == EXIT_FAIL and team["verdict"] == expected.verdict, table
    failing = {s["name"]: s for s in team["slas"] if not s["passed"]}
    assert set(failing) == set(expected.failing), table
    for sla, note in expected.failing.items():
        assert note in failing[sla]["note"], table
    assert [f["cause"] for f in team["run"]["launch_findings"]] == [cause], table
    # the fixed run: the line with the fix, and every SLA of the experiment passes
    assert f"Applied: {cause}." in text and piece in " ".join(fixed["run"]["launch"]["launch"])
    fixed_table = "\n".join(f"{s['name']} {s['passed']} {s['measured']} {s['note']}"
                            for s in fixed["slas"])
    assert fixed["verdict"] == "pass", fixed_table
    assert fixed["run"]["launch_findings"] == [], fixed_table
    assert "| verdict | FAIL | PASS |" in text


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("name", guarded(SHOWN_WITH_BAR, runs=2))  # the team's, the bar's
def test_bar_sets_the_teams_monitors_beside_the_bars(name: str, tmp_path: Path,
                                                     golden_cache: Path) -> None:
    """Issue 54's bar for monitors: the team's run as its scenario says, then its faults (rank
    1's update corrupted from step 5) on the reference trainer. Both fingerprints name rank 1
    exactly, the team's at its 4-step period (3 steps after the onset), the bar's, which
    checks every step, 1 step after; no spike rule fires; no monitor fires in a golden run."""
    from faultlab.cli import main

    code = main(["run", "--bar", "--report-dir", str(tmp_path), "--golden-cache",
                 str(golden_cache), str(EXAMPLES / name.replace("/", "/experiments/"))])
    [md] = list(tmp_path.glob("*/bar-monitors.md"))
    text = md.read_text()
    team = json.loads((md.parent / "journal.json").read_text())
    _check(SCENARIOS[name], team["verdict"], team["slas"], text)
    assert code == 0, text
    cells = {tuple(r[:2]): r[2:] for r in (
        [c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
        if line.startswith("| team |") or line.startswith("| bar |"))}
    assert cells == {
        ("team", "fingerprint"): ["yes", "3", "exact", "0"],
        ("team", "spike"): ["not detected", "—", "—", "0"],
        ("bar", "cross-replica fingerprint (anomaly:sdc_suspected)"): ["yes", "1", "exact", "0"],
        ("bar", "loss spike check (anomaly:loss_spike)"): ["not detected", "—", "—", "0"],
        ("bar", "grad-norm spike check (anomaly:grad_norm_spike)"): ["not detected", "—", "—",
                                                                      "0"],
        ("bar", "straggler score (anomaly:straggler)"): ["not detected", "—", "—", "0"],
    }, text
    assert "- bar: onset: sdc-update at step 5 on rank 1" in text, text
    assert "## silent_ddp_sdc_update: the team's monitors beside the bar's" in \
        (md.parent / "report.md").read_text()


@pytest.mark.integration
def test_init_writes_a_valid_starter_from_two_fault_free_runs(tmp_path: Path) -> None:
    from faultlab.cli import main

    out = tmp_path / "starter.yaml"
    trainer = EXPERIMENTS.parent / "train.py"
    code = main(["init", "--name", "starter", "--out", str(out), "--report-dir",
                 str(tmp_path / "reports"), "--", "torchrun", "--nnodes", "2",
                 "--nproc-per-node", "1", str(trainer), "--steps", "8", "--ckpt-every", "4",
                 "--ckpt-dir", str(tmp_path / "ckpts")])
    assert code == 0 and out.read_text().startswith("# starter: a starter chaos experiment")
    # the second fault-free run ended bitwise equal: the starter checks bitwise equality
    assert "# Two fault-free runs ended bitwise equal: the trainer is reproducible here" in \
        out.read_text()
    exp = load_experiment(out)
    # pointed into init's own run folder before the run: the user's directory stays untouched
    assert exp.target.command == ("python", str(trainer), "--steps", "8", "--ckpt-every", "4",
                                  "--ckpt-dir", "{run_dir}/ckpts")
    # the user's own torchrun line runs it, with a static master filled in per launch: two
    # nodes could not meet otherwise (torchrun's default backend is static)
    assert exp.target.launch == ("torchrun", "--nnodes", "2", "--nproc-per-node", "1",
                                 "--master-addr", "{master_addr}", "--master-port",
                                 "{master_port}", "--node-rank", "{node_rank}")
    assert not (tmp_path / "ckpts").exists()
    assert (exp.topology.nodes, exp.run.steps, exp.run.checkpoint_every) == (2, 8, 4)
    assert exp.faults[0].type == "rank_kill" and exp.faults[0].trigger.at_step == 6
    assert exp.expect.bitwise_equal_to_golden is True and exp.observe.log_pattern
