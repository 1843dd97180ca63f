"""The judge: turns what a run measured into a verdict.

It applies the SLAs — each one declaration of ``faultlab.sla``, which says what it measures,
how it compares and what its note says; ``slas.py`` lists them by key, beside a campaign's own —
to one run: the verdict, one ``SLAResult`` per SLA and per fault, judged by ``judge()``
(``verdict.py``) from the run's records (``evidence.py``, what a declaration reads);
and the verdict of N runs of one experiment judged together, with the spread of what they
measured (``repeats.py``: ``summarize``, ``parse_pass_rate``).
The spec's ``Expect`` model, built from the same declarations, validates what an experiment
states.

It may import ``faultlab.errors``, ``faultlab.sla``, ``faultlab.spec`` and ``faultlab.observe``;
never the engine, targets, faults or report (the engine calls the judge; the report renders its
results).

    results = judge(exp, metrics, golden, timed_out=False, faults=records)
    failed = [r.describe() for r in results if not r.passed]
"""

from faultlab.judge.slas import SLA_KINDS, SLAS, Sla
from faultlab.judge.verdict import SLAResult, judge

__all__ = ["SLAS", "SLA_KINDS", "SLAResult", "Sla", "judge"]
