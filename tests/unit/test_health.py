"""reference_trainer.health: the step watchdog, run in a child process (it ends the process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reference_trainer.health import EXIT_CODES, SlowStepTracker, attribute_slow_links

REPO = Path(__file__).resolve().parents[2]


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_watchdog_fires_dumps_every_stack_and_exits_even_if_on_fire_raises() -> None:
    proc = _run("""
        import sys, threading, time
        from reference_trainer.health import Watchdog

        def on_fire(idle):
            print(f"ON_FIRE idle={idle:.3f}", file=sys.stderr, flush=True)
            raise RuntimeError("reporting failed")  # the process must exit all the same

        def parked_helper():
            time.sleep(60)

        threading.Thread(target=parked_helper, name="helper", daemon=True).start()
        t0 = time.monotonic()
        Watchdog(0.3, on_fire).start()
        time.sleep(20)
        print("NOT FIRED", time.monotonic() - t0)
    """)
    assert proc.returncode == EXIT_CODES["watchdog"] == 3, proc.stderr
    assert "NOT FIRED" not in proc.stdout
    err = proc.stderr
    assert "[watchdog] no progress" in err
    # faulthandler's dump of every thread: the main thread asleep, and the helper thread.
    assert "most recent call first" in err
    assert err.lower().count("thread 0x") >= 3  # main, helper, and the watchdog itself
    assert "parked_helper" in err
    # on_fire ran after the dump, with the idle time, and it had passed the limit.
    fired = [line for line in err.splitlines() if line.startswith("ON_FIRE")]
    assert len(fired) == 1
    idle = float(fired[0].split("=")[1])
    assert 0.3 < idle < 10.0
    assert err.index("most recent call first") < err.index("ON_FIRE")


def test_regular_beats_keep_it_quiet_and_stop_disarms_it() -> None:
    proc = _run("""
        import sys, time
        from reference_trainer.health import Watchdog

        # a limit a loaded machine's scheduling gaps stay under: beats come every 50 ms
        wd = Watchdog(1.0, lambda idle: print("ON_FIRE", file=sys.stderr, flush=True)).start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0:  # three times the limit
            wd.beat()
            time.sleep(0.05)
        print("BEAT PHASE DONE", flush=True)
        wd.stop()
        time.sleep(1.5)  # no beats, but stopped
        print("SURVIVED", flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["BEAT", "PHASE", "DONE", "SURVIVED"]
    assert "ON_FIRE" not in proc.stderr and "[watchdog]" not in proc.stderr


def test_exit_codes_are_distinct() -> None:
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)
    assert EXIT_CODES["completed"] == 0 and EXIT_CODES["usage"] == 2


# --- straggler detection ---------------------------------------------------------------------

def test_straggler_is_named_after_enough_steps_once_per_episode() -> None:
    from reference_trainer.health import StragglerDetector

    d = StragglerDetector(3, threshold_s=0.05, num_steps=3)
    slow1 = [0.20, 0.001, 0.19]  # ranks 0 and 2 wait ~0.2 s for rank 1
    assert d.update(slow1) is None and d.update(slow1) is None
    named = d.update(slow1)
    assert named is not None and named["straggler_rank"] == 1
    assert named["wait_gap_s"] == pytest.approx(0.189)
    assert d.update(slow1) is None  # once per episode
    quiet = [0.01, 0.012, 0.008]
    for _ in range(3):
        assert d.update(quiet) is None
    assert [d.update(slow1) for _ in range(3)][-1] is not None  # a new episode


def test_noise_and_a_single_fast_peer_are_not_stragglers() -> None:
    from reference_trainer.health import StragglerDetector

    d = StragglerDetector(3, threshold_s=0.05, num_steps=2)
    # rank 2 waits little too: rank 1 is not the one *everyone* waits for
    assert all(d.update([0.2, 0.0, 0.03]) is None for _ in range(5))
    # alternating candidates never accumulate
    assert all(d.update(w) is None for w in [[0.2, 0.0, 0.2], [0.0, 0.2, 0.2]] * 3)
    assert StragglerDetector(1, threshold_s=0.05, num_steps=1).update([0.0]) is None


# --- slow steps and slow links ----------------------------------------------------------------

def test_slow_step_tracker_flags_once_per_episode_after_warm_up() -> None:
    t = SlowStepTracker(factor=3.0, num_steps=3)
    assert not t.update(9.0)  # the first step is warm-up, never a baseline
    assert [t.update(s) for s in (0.4, 0.5, 0.4, 0.45)] == [False] * 4
    assert t.baseline_s == 0.45
    assert [t.update(s) for s in (2.0, 2.0, 2.0, 2.0)] == [False, False, True, False]
    assert t.baseline_s == 0.45  # slow steps never enter the baseline
    assert [t.update(s) for s in (0.4, 0.4, 0.4)] == [False] * 3  # the episode ends
    assert [t.update(s) for s in (2.0, 2.0, 2.0)] == [False, False, True]
    assert not any(SlowStepTracker(factor=0, num_steps=1).update(s) for s in (1, 1, 1, 50))


@pytest.mark.parametrize(("transfers", "expected"), [
    # 3 ranks, rank 1's uplink: both of its sends are slow, nothing else
    ([(0, 1, .01), (1, 2, .5), (2, 0, .01), (0, 2, .01), (1, 0, .4), (2, 1, .01)],
     (1, "uplink")),
    # 3 ranks, rank 2's downlink
    ([(0, 1, .01), (1, 2, .5), (2, 0, .01), (0, 2, .6), (1, 0, .01), (2, 1, .01)],
     (2, "downlink")),
    # 3 ranks, rank 0 slow both ways: every transfer touching it
    ([(0, 1, .5), (1, 2, .01), (2, 0, .5), (0, 2, .5), (1, 0, .5), (2, 1, .01)],
     (0, "both")),
    # 2 ranks, one direction slow: the sender, with the other reading noted
    ([(0, 1, .001), (1, 0, .17)], (1, "uplink")),
])
def test_the_slow_links_name_their_rank(transfers: list[tuple[int, int, float]],
                                        expected: tuple[int, str]) -> None:
    found = attribute_slow_links(transfers, factor=3.0)
    assert found is not None and (found["straggler_rank"], found["link"]) == expected
    if len({s for s, _d, _t in transfers}) == 2:
        assert found["also_consistent_with"] == "the downlink of rank 0"


@pytest.mark.parametrize("transfers", [
    [(0, 1, .01), (1, 2, .012), (2, 0, .011)],  # nothing slow
    [(0, 1, .5), (1, 0, .5)],  # two ranks, slow both ways: no culprit to name
    [(0, 1, .5), (1, 2, .01), (2, 3, .5), (3, 0, .01)],  # two unrelated slow links
])
def test_no_single_culprit_names_no_one(transfers: list[tuple[int, int, float]]) -> None:
    assert attribute_slow_links(transfers, factor=3.0) is None


def test_milliseconds_of_scheduling_are_no_slow_link() -> None:
    """The probe of a 2-rank job whose rank 1 computed 5x slower, on the loaded suite: 20
    times the fastest, but 6 ms, the least of three transfers. Only a transfer slower by the
    straggler threshold as well (50 ms) names a link."""
    seen = [(0, 1, 0.006), (1, 0, 0.0003)]
    assert attribute_slow_links(seen, factor=3.0) is not None  # the ratio alone: rank 0
    assert attribute_slow_links(seen, factor=3.0, floor_s=0.05) is None
    throttled = [(0, 1, 0.0003), (1, 0, 0.335)]  # 1 MiB over a 25 Mbit/s uplink
    found = attribute_slow_links(throttled, factor=3.0, floor_s=0.05)
    assert found is not None and (found["straggler_rank"], found["link"]) == (1, "uplink")


PROBE = """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from reference_trainer.health import attribute_slow_links, probe_links
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank,
                            world_size=2)
    send, late = dist.send, {}
    def late_once(*args, **kwargs):  # the scheduler ran the sender late after one barrier
        if late.pop("once", False):
            time.sleep(0.3)
        return send(*args, **kwargs)
    dist.send = late_once
    found = {}
    for r in (1, 3):
        late["once"] = rank == 0
        transfers = probe_links(rank, 2, torch.device("cpu"), 1 << 20, repeats=r)
        assert "once" not in late or rank != 0  # the late start happened in this probe
        found[r] = attribute_slow_links(transfers, factor=3.0, floor_s=0.05)  # the default
    if rank == 0:
        print(json.dumps({r: f and [f["straggler_rank"], f["link"]] for r, f in found.items()}))
    dist.destroy_process_group()
"""


def test_a_sender_run_late_once_is_no_slow_link(tmp_path: Path) -> None:
    """Two real gloo ranks, the probe's 1 MiB transfers: rank 0 starts one send 0.3 s late
    after its barrier, as a loaded host's scheduler may. Timed once, that names rank 0's
    uplink, past the trainer's 50 ms floor too; the least of three transfers sees a link that
    is fast every other time."""
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(PROBE))
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(store)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert json.loads(outs[0][0]) == {"1": [0, "uplink"], "3": None}, outs


def test_an_armed_deadline_fires_while_beats_go_on_and_names_what_hung(tmp_path: Path) -> None:
    """An async save stuck in the kernel: its thread blocks in open() of a FIFO nobody reads
    (a real uninterruptible-looking wait, as on a hung mount) while the training thread keeps
    beating. The deadline, not the beats, decides; an earlier save that finished in time and
    disarmed it never fires."""
    fifo = tmp_path / "stuck"
    proc = _run(f"""
        import os, sys, threading, time
        from reference_trainer.health import Watchdog

        wd = Watchdog(5.0, lambda idle: print("ON_FIRE", wd.overdue, file=sys.stderr,
                                              flush=True)).start()
        wd.arm(0.3, {{"what": "checkpoint_save", "step": 10}})
        wd.disarm()  # this save finished in time
        time.sleep(0.8)
        print("DISARMED QUIET", flush=True)
        os.mkfifo({str(fifo)!r})
        def stuck_writer():
            open({str(fifo)!r}, "wb")  # blocks until a reader opens it: never
        wd.arm(0.5, {{"what": "checkpoint_save", "step": 20}})
        threading.Thread(target=stuck_writer, name="checkpoint-commit-20", daemon=True).start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:  # steps go on
            wd.beat()
            time.sleep(0.05)
        print("NOT FIRED", flush=True)
    """)
    assert proc.returncode == EXIT_CODES["watchdog"], proc.stderr
    assert proc.stdout.split() == ["DISARMED", "QUIET"]
    assert "[watchdog] checkpoint_save unfinished after" in proc.stderr
    assert "stuck_writer" in proc.stderr  # the stack dump shows where it hangs
    fired = [line for line in proc.stderr.splitlines() if line.startswith("ON_FIRE")]
    assert len(fired) == 1 and "'step': 20" in fired[0]
    seconds = float(fired[0].split("'seconds': ")[1].rstrip("}"))
    assert 0.5 < seconds < 5.0  # past its own deadline, well before the no-progress limit
