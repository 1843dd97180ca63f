"""Every user-visible message of the plugin, in one place so tests import them instead of
retyping them. ``{placeholders}`` are filled with ``str.format``."""

from __future__ import annotations

BAD_INTEGER = "{setting} from {source} is not an integer in [0, 2**63); use e.g. 0 or 1234"
BAD_REPEAT = "{setting} from {source} is not a number of runs >= 1; use e.g. 20"
BAD_PASS_RATE = "{setting} from {source}: {problem}"
PASS_RATE_WITHOUT_REPEAT = ("{setting} from {source} needs faultlab_repeat (--faultlab-repeat) "
                            "of 2 or more: a single run either passes or fails")
REPEAT_FAILED = "{name}: FAIL over {num_runs} runs: {stability}"
BAD_DIRECTORY = "{setting} from {source} is not a directory ({path}); point it at a folder"
MISSING_PATH = ("{setting} from {source}: no such file or directory: {path}; list experiment "
                "files or folders that exist")
INVALID_EXPERIMENT = "invalid experiment ({count} problem(s)); nothing was run or injected:"
SLA_FAILED = "{name}: FAIL ({failed} of {total} SLA(s) failed)"
INCONCLUSIVE = ("{name}: INCONCLUSIVE (nothing failed, but {names} could not be measured: not a "
                "pass; the note says what to add)")
REPEAT_INCONCLUSIVE = "{name}: INCONCLUSIVE over {num_runs} runs: {stability}"
STOPPED_BEFORE_LAUNCH = "{name}: FAIL (stopped before the job was launched: nothing was measured)"
RUN_ERROR = "the run broke: {error}"
JOURNAL = "journal: {path}"
NO_MARKER = ("the faultlab_result fixture needs a @pytest.mark.faultlab_experiment(...) marker "
             "on {nodeid} (an experiment dict, a YAML path or an Experiment)")
MARKER_WITHOUT_FIXTURE = ("{nodeid} has @pytest.mark.faultlab_experiment but does not ask for "
                          "the faultlab_result fixture, so its experiment would never run; add "
                          "a faultlab_result argument")
BAD_MARKER = ("@pytest.mark.faultlab_experiment on {nodeid} takes one experiment (a dict, a "
              "YAML path or an Experiment), got {value}")
BAD_EXPERIMENT_ARG = ("faultlab.run() takes an experiment dict, a YAML path or an Experiment, "
                      "got {value}")
SUITE_IN_RUN = ("{path} is a suite of {count} experiments; faultlab.run() runs one experiment "
                "(collect the suite as test items with `pytest {path}` instead)")
MARKER_HELP = ("faultlab_experiment(experiment, *, seed=None): run this faultlab experiment "
               "(a dict, a YAML path relative to the test file, or an Experiment) and pass its "
               "RunResult to the test's faultlab_result argument")
