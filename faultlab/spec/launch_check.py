"""What a launch line must do on nodes that start with one: the checks a target's
``check_launch`` (``faultlab.targets.base.Target``) runs on ``target.launch`` when an
experiment loads.

``line_problems`` is what the built-in targets whose nodes start with a line share (local
processes, docker containers, an attached job's): the line addresses every node, dials no store
that is not its own, and names every service port it uses (docker then adds what a line needs
inside a container: ``faultlab.spec.launch.docker_problems``). Each problem is ``(yaml path
under the experiment, message)``; the spec turns it into a located error. A team's target
calls it from its own ``check_launch``, or checks what its own nodes need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faultlab.spec.launch import addressing_problem, service_problem, store_problem

if TYPE_CHECKING:
    from faultlab.spec.target import TargetSpec, Topology

__all__ = ["Problems", "line_problems"]

Problems = list[tuple[tuple[str | int, ...], str]]
"""``(yaml path under the experiment, message)`` of each problem: ``check_launch``'s answer."""


def line_problems(target: TargetSpec, topology: Topology, *, default_line: bool = False
                  ) -> Problems:
    """The first problem of the line each node starts with (``target.launch_line``), as the
    spec reports it: a line of the team's own always, a command's default torchrun line only
    with ``default_line`` (nodes where it must run too: docker's containers)."""
    if target.launch is None and not default_line:
        return []
    line = target.launch_line(topology.launcher)
    if line is None:  # faultlab's launcher: nothing of the team's to check
        return []
    own = isinstance(target.launch, tuple)  # else a named line (torchrun): no index to show
    why = addressing_problem(line, topology.nodes)
    if why is not None:
        return [(("target", "launch"), why)]
    store = store_problem(line)
    if store is not None:
        return [(("target", "launch", store[0]) if own else ("target", "launch"), store[1])]
    unanswered = service_problem(line, target.services)
    if unanswered is not None:
        at, problem = unanswered
        return [(("target", *at), problem)]
    return []
