"""faultlab.metadata: a fake cloud metadata server that real clients accept.

Spot preemption reaches a training job through its cloud's metadata endpoint, so that is
where faultlab injects it. One ``MetadataServer`` plays one cloud for one node (each node of
a job points at its own)::

    from faultlab.metadata import MetadataServer

    with MetadataServer("aws", imds_v2_required=True, node="node1") as md:
        launch_node(env={**os.environ, **md.env()})   # AWS_EC2_METADATA_SERVICE_ENDPOINT=...
        deadline = md.announce_preemption(notice_s=120)
        ...
        assert md.state()["requests_by_path"]["/latest/meta-data/spot/instance-action"]

What each cloud serves, and how faithfully, is in the provider modules: ``aws`` (IMDS v1 and
v2: tokens, ``spot/instance-action``, ``spot/termination-time``, rebalance
recommendations, scheduled maintenance, identity document), ``gce`` (``preempted``,
``maintenance-event``, ``wait_for_change``) and ``azure`` (scheduled events with
``StartRequests`` acknowledgements). botocore's own ``IMDSFetcher`` is the client the AWS fake
is tested with.

From a shell: ``faultlab metadata serve --provider aws`` prints the URL, the ``export`` lines
and a control token for ``POST /_faultlab/preempt`` (see ``faultlab.metadata.server``).

It may import ``faultlab.errors`` only: the faults and the engine start it, and
``faultlab metadata serve`` runs it on its own.
"""

from faultlab.metadata._board import DEFAULT_NOTICE_S, PROVIDERS
from faultlab.metadata.server import CONTROL_TOKEN_HEADER, MetadataServer

__all__ = ["CONTROL_TOKEN_HEADER", "DEFAULT_NOTICE_S", "PROVIDERS", "MetadataServer"]
