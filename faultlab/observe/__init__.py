"""faultlab.observe: read a job's event stream as it grows and derive the experiment metrics.

``EventStream`` takes the node relays' batches from the engine's hub, or tails
``RUN_DIR/events/*.jsonl`` (the event protocol of ``faultlab.runtime.events``), for the engine;
``compute_metrics`` turns the records and the injected faults into ``Metrics`` — detection
latency, resume and recovery time, lost steps, goodput, sample accounting — with
every definition spelled out in ``faultlab.observe.timeline`` (per fault) and
``faultlab.observe.metrics`` (run level).

It may import ``faultlab.errors``, ``faultlab.spec`` and ``faultlab.runtime`` (the event
protocol); never the targets, the faults, the judge or the engine, which all read it.
"""

from faultlab.observe.metrics import FaultMetrics, FaultRecord, Metrics, compute_metrics
from faultlab.observe.stream import EventStream

__all__ = ["EventStream", "FaultMetrics", "FaultRecord", "Metrics", "compute_metrics"]
