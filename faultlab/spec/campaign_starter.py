"""``faultlab campaign init``: a starter campaign whose mix is weighted like a real cluster's.

The weights are the root causes of the 419 unexpected interruptions of Llama 3's pre-training
(Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 5: a 54-day snapshot on
16,384 H100 GPUs), each category mapped onto the faultlab fault that produces its symptom in a
job. Each entry of the written file says which categories it stands for, their counts and
shares, and the source. The rate is compressed: one failure every ``mtbf_steps`` training steps
(the step clock: the same seed gives the same scoring, run after run), or every ``mtbf_s``
seconds of the job (the wall clock), stands for Llama 3's one every ~3 hours. A reversible
fault is undone ``until: reaction`` (capped by ``duration_s``): it lasts until the job notices
it, whatever the machine's speed.
"""

from __future__ import annotations

__all__ = ["LLAMA3_MIX", "LLAMA3_SOURCE", "starter_campaign"]

LLAMA3_SOURCE = ("Llama 3 Herd of Models (arXiv:2407.21783), Table 5: 419 unexpected "
                 "interruptions in 54 days")

LLAMA3_MIX: tuple[tuple[str, int, str, str], ...] = (
    # (categories with count and share of the 419, weight, the entry's YAML, why this fault)
    ("Faulty GPU 148 (30.1 %), GPU SRAM memory 19 (4.5 %), GPU system processor 17 (4.1 %), "
     "GPU thermal interface + sensor 6 (1.4 %)", 190,
     "{type: gpu_error, weight: 190, target: random, params: {xid: 79}, "
     "until: reaction, duration_s: 60}",
     "the GPU falls off the bus (Xid 79): the rank's next CUDA call fails"),
    ("GPU HBM3 memory 72 (17.2 %)", 72,
     "{type: gpu_error, weight: 72, target: random, params: {xid: 48}, "
     "until: reaction, duration_s: 60}",
     "an uncorrectable ECC error (Xid 48)"),
    ("Software bug 54 (12.9 %)", 54,
     "{type: rank_kill, weight: 54, target: random, params: {signal: SEGV}}",
     "a crashing rank"),
    ("Host maintenance 32 (7.6 %), power supply 3 (0.7 %), server chassis 2 (0.5 %), IO "
     "expansion board 2 (0.5 %), CPU 2 (0.5 %), system memory 2 (0.5 %)", 43,
     "{type: node_kill, weight: 43, target: random}",
     "the machine is gone: its agent and every rank die at once"),
    ("Network switch/cable 35 (8.4 %), NIC 7 (1.7 %)", 42,
     "{type: collective_error, weight: 42, target: random, until: reaction, duration_s: 60}",
     "a collective fails with 'Connection reset by peer'"),
    ("NCCL watchdog timeouts 7 (1.7 %)", 7,
     "{type: collective_hang, weight: 7, target: random, until: reaction, duration_s: 60}",
     "a collective that never completes, until the watchdog ends it"),
    ("Silent data corruption 6 (1.4 %)", 6,
     "{type: weight_bitflip, weight: 6, target: random, params: {bit_index: 30}}",
     "a flipped exponent bit in a weight"),
    ("SSD 3 (0.7 %), dependency 2 (0.5 %)", 5,
     "{type: io_error, weight: 5, target: all, until: reaction, duration_s: 60}",
     "checkpoint writes fail with EIO"),
)


def starter_campaign(name: str = "my_campaign", *, mtbf_steps: float | None = 40.0,
                     mtbf_s: float | None = None, duration_s: float = 120.0) -> str:
    """The YAML text of a starter campaign on the reference trainer (3 nodes, elastic down to
    2, so a lost machine does not end it): on the step clock, or on the wall clock when
    ``mtbf_s`` is given."""
    mix = []
    for categories, _weight, entry, why in LLAMA3_MIX:
        mix.append(f"    # {categories}: {why}.\n    # Source: {LLAMA3_SOURCE}.\n"
                   f"    - {entry}")
    if mtbf_s is None:
        clock = (f"  mtbf_steps: {mtbf_steps:g}   # mean training steps between faults (the step "
                 f"clock: the\n  #   same seed gives the same scoring; mtbf_s + duration_s: the "
                 f"wall clock)\n  start_after_step: 5")
        what = f"one every {mtbf_steps:g} training steps"
    else:
        clock = (f"  mtbf_s: {mtbf_s:g}   # mean seconds between faults (the wall clock: they "
                 f"also strike\n  #   while the job restarts; mtbf_steps: the step clock, "
                 f"reproducible)\n  duration_s: {duration_s:g}\n  start_after_s: 5")
        what = f"one every {mtbf_s:g} s"
    return f"""\
# {name}: a failure campaign: faults arrive at random (a seeded Poisson process, {what}
# on average), drawn from a mix weighted like Llama 3's interruptions; every
# injection is scored (detected, attributed, recovered, steps lost, compound) and ETTR is
# measured against the pre-launch projection for the same rate.
# Hardware: any CPU host (2 cores is enough); gloo; 3 local nodes of 1 rank.
# Run: faultlab run {name}.yaml    (faultlab run --dry-run {name}.yaml shows the schedule)
# Replace target with your trainer (target.command) and drop the entries it cannot take.
name: {name}
seed: 0
target: {{trainer: reference, preset: tiny}}
topology: {{nodes: 3, procs_per_node: 1, min_nodes: 2}}
run: {{steps: 400, checkpoint_every: 10, timeout_s: {max(600.0, duration_s * 2):g}}}
campaign:
{clock}
  mix:
{chr(10).join(mix)}
expect:
  completes: true
  ettr: 0.5
  detection_rate: 0.8
  false_positives_per_hour: 0
"""
