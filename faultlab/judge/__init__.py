"""The judge: turns what a run measured into a verdict.

It owns the SLAs — for every ``expect`` key, the metric it is judged against and how
(``slas.py``) — the comparison of the run's final digest with the fault-free golden run's, and
the verdict: one ``SLAResult`` per SLA and per fault, judged by ``judge()`` (``verdict.py``);
and the verdict of N runs of one experiment judged together, with the spread of what they
measured (``repeats.py``: ``summarize``, ``parse_pass_rate``).
The spec's ``Expect`` model says which keys an experiment may state and validates them; the
judge says what each one means.

It may import ``faultlab.errors``, ``faultlab.spec`` and ``faultlab.observe``; never the
engine, targets, faults or report (the engine calls the judge; the report renders its results).

    results = judge(exp, metrics, golden, timed_out=False, faults=records)
    failed = [r.describe() for r in results if not r.passed]
"""

from faultlab.judge.slas import SLA_KINDS, SLAS, Sla
from faultlab.judge.verdict import SLAResult, judge

__all__ = ["SLAS", "SLA_KINDS", "SLAResult", "Sla", "judge"]
