"""What a dry run shows, and the seeded choices the engine will make, agree and repeat."""

from __future__ import annotations

import random

from faultlab.spec import (
    Experiment,
    arrival_times_s,
    describe_schedule,
    parse_experiment,
    resolve_selector,
)

DOC = """\
name: schedule
seed: {seed}
topology: {{nodes: 3, procs_per_node: 2}}
run: {{steps: 40, timeout_s: 200}}
faults:
  - id: kill
    type: rank_kill
    target: {{rank: 1}}
    trigger: {{at_step: 12}}
  - type: rank_hang
    target: random
    trigger: {{after_event: {{kind: checkpoint_saved, count: 2, match: {{rank: 0}}}}}}
    duration_s: 10
    until: reaction
  - type: node_kill
    target: random
    trigger: {{every: {{mtbf_s: 30, max_count: 3, start_after_s: 5}}}}
  - type: node_hang
    target: {{node: 2}}
    trigger: {{at_time_s: 7.5}}
    duration_s: 2
  - type: rank_kill
    target: all
    trigger: {{at_step: 40}}
"""


def experiment(seed: int = 0) -> Experiment:
    return parse_experiment(DOC.format(seed=seed))


def test_resolve_selector() -> None:
    exp = experiment(seed=5)
    assert resolve_selector(exp, 0) == ("rank", 1)
    assert resolve_selector(exp, 3) == ("node", 2)
    assert resolve_selector(exp, 4) == ("all", None)
    # random: the fault's first target kind, drawn from Random(f"{seed}/{index}")
    assert resolve_selector(exp, 1) == ("rank", random.Random("5/1").randrange(6))
    assert resolve_selector(exp, 2) == ("node", random.Random("5/2").randrange(3))
    assert resolve_selector(exp, 2, occurrence=1) == ("node", random.Random("5/2/1")
                                                      .randrange(3))
    # deterministic, and the seed matters
    assert resolve_selector(experiment(seed=5), 1) == resolve_selector(exp, 1)
    draws = {resolve_selector(experiment(seed=s), 1)[1] for s in range(30)}
    assert draws == set(range(6))


def test_arrival_times_are_seeded_bounded_and_capped() -> None:
    exp = experiment(seed=3)
    times = arrival_times_s(exp, 2)
    assert times == arrival_times_s(experiment(seed=3), 2)
    assert times != arrival_times_s(experiment(seed=4), 2)
    assert 0 < len(times) <= 3 and times == sorted(times)
    assert all(5 < t < 200 for t in times)
    assert arrival_times_s(exp, 0) == []  # not an `every` fault
    many = parse_experiment("name: m\nrun: {timeout_s: 100}\nfaults:\n  - {type: rank_kill, "
                            "target: random, trigger: {every: {mtbf_s: 0.001}}}\n")
    assert len(arrival_times_s(many, 0)) == 10_000
    assert len(arrival_times_s(many, 0, limit=7)) == 7


def test_describe_schedule_says_what_where_when_and_how_it_is_undone() -> None:
    exp = experiment(seed=0)
    lines = describe_schedule(exp)
    assert len(lines) == len(exp.faults)
    rank = resolve_selector(exp, 1)[1]
    assert lines[0] == ("kill: rank_kill (signal=KILL) on rank 1 when step 12 is done; "
                        "permanent (this fault cannot be undone)")
    assert lines[1] == (f"rank_hang-1: rank_hang on rank {rank} (random, drawn from seed 0) "
                        f"after the 2nd checkpoint_saved event with rank=0; undone after 10 s "
                        f"or when the job reacts, whichever comes first (and always when the "
                        f"experiment ends)")
    times = ", ".join(f"{t:.1f} s" for t in arrival_times_s(exp, 2))
    assert lines[2].startswith("node_kill-2: node_kill (signal=KILL, method=processes) on a "
                               "random node each time (nodes ")
    assert lines[2].endswith(f"drawn from seed 0) at seeded random times (MTBF 30 s after 5 s, "
                             f"at most 3 times): {times}; permanent (this fault cannot be "
                             f"undone)")
    assert lines[3] == ("node_hang-3: node_hang on node 2 7.5 s after the job starts; undone "
                        "after 2 s (and always when the experiment ends)")
    assert lines[4].startswith("rank_kill-4: rank_kill (signal=KILL) on every rank when step "
                               "40 is done")
    assert describe_schedule(parse_experiment("name: calm\n")) == []
