"""What a fault needs of its target, and what a target offers (``faultlab.fault_api.context``).

A fault declares the context capabilities it needs beyond the core ``FaultContext``
(``needs``), a target class the ones it offers (``offers``); the experiment loader refuses a
fault on a launcher whose target lacks one, saying which, what it is and which launchers offer
it. The move from launcher names to capabilities changed nothing for the built-in launchers:
every shipped experiment validates, and every built-in fault is hosted by exactly the launchers
that listed it before (``OLD_LAUNCHERS``, its ``launchers`` at commit 7bbb3fb). A team's
target hosts the built-in faults it offers what they need for, and ``require`` refuses, at
injection, a fault whose capability the target lacks.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from faultlab.errors import FaultError, InvalidExperimentError
from faultlab.fault_api import CONTEXT_CAPABILITIES, Fault, Victim, require
from faultlab.faults import fault_types, storage_io
from faultlab.faults.network import NetworkPartitionFault
from faultlab.faults.process import NodePauseFault, ServiceKillFault
from faultlab.spec import load_document, parse_experiment
from faultlab.spec.target import launcher_names, launcher_offers
from faultlab.targets.base import JobContext
from faultlab.targets.docker import DockerTarget
from faultlab.targets.local import LocalTarget
from faultlab.targets.slurm import SlurmTarget
from tests.unit.team_site import run_with, team_package

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted([*REPO.glob("experiments/*.yaml"), *REPO.glob("examples/*/experiments/*.yaml")])
BUILTIN_LAUNCHERS = ("local", "docker", "slurm")

_ALL = ("local", "docker", "slurm")
OLD_LAUNCHERS: dict[str, tuple[str, ...]] = {
    **{name: _ALL for name in (
        "ckpt_bitflip", "ckpt_delete_shard", "ckpt_stale_pointer", "ckpt_torn_write",
        "ckpt_truncate", "ckpt_zero_range", "collective_delay", "collective_error",
        "collective_hang", "collective_partition", "disk_full", "grad_inf", "grad_nan",
        "io_error", "io_hang", "io_latency", "loss_spike", "node_hang", "node_kill",
        "rank_hang", "rank_kill", "sdc", "weight_bitflip")},
    "gpu_error": ("local",), "gpu_oom": ("local",), "gpu_slow": ("local",),
    "network_flap": ("docker",), "network_partition": ("docker",),
    "network_throttle": ("docker",), "node_pause": ("docker",),
    "node_return": ("local", "docker"), "service_kill": ("local",),
    "slurm_node_down": ("slurm",), "slurm_preempt": ("slurm",), "spot_preemption": ("local",),
    "stale_shared_fs": ("local", "docker"),
}
"""Each built-in fault's ``launchers`` before it declared ``needs`` (commit 7bbb3fb); a fault
added since (``sdc``) with the launchers its ``needs`` give it."""


def _builtins() -> dict[str, type[Fault]]:
    return {n: c for n, c in fault_types().items() if c.__module__.startswith("faultlab.faults")}


# -- nothing changed for the built-in launchers -------------------------------------------------


def test_every_builtin_fault_is_in_the_old_table() -> None:
    assert set(_builtins()) == set(OLD_LAUNCHERS)


@pytest.mark.parametrize("name", sorted(OLD_LAUNCHERS))
def test_a_builtin_fault_is_hosted_by_the_launchers_that_listed_it(name: str) -> None:
    cls = _builtins()[name]
    hosts = {n for n in BUILTIN_LAUNCHERS if set(cls.needs) <= launcher_offers(n)}
    assert hosts == set(OLD_LAUNCHERS[name])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_experiment_still_validates(path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # What this host offers the storage passthrough (FUSE, a shared mount) is not the
    # launcher's: held fixed, so that the test says the same on every machine.
    monkeypatch.setattr(storage_io, "fuse_unavailable", lambda: None)
    monkeypatch.setattr(storage_io, "propagates", lambda path: True)
    load_document(path)


# -- the vocabulary, and the targets that offer it ----------------------------------------------


def test_every_capability_is_described_and_needed_or_offered() -> None:
    needed = {n for cls in fault_types().values() for n in cls.needs}
    offered = {n for name in BUILTIN_LAUNCHERS for n in launcher_offers(name)}
    for name, cap in CONTEXT_CAPABILITIES.items():
        assert cap.name == name and cap.description and "\n" not in cap.description
        assert name in offered, f"{name}: no built-in target offers it"
    assert needed <= offered


@pytest.mark.parametrize("target", [LocalTarget, DockerTarget, SlurmTarget],
                         ids=lambda c: c.__name__)
def test_a_target_implements_the_protocol_of_every_capability_it_offers(target: type) -> None:
    for name in target.offers:
        protocol = CONTEXT_CAPABILITIES[name].protocol
        for method in CONTEXT_CAPABILITIES[name].methods():
            if protocol is None or not callable(vars(protocol).get(method)):
                continue  # an attribute: set by the target's __init__
            own = getattr(target, method, None)
            assert own is not None and own is not getattr(JobContext, method, None), \
                f"{target.__name__} offers {name} but does not implement {method}"


def test_the_extending_guide_has_a_row_for_every_capability_with_who_offers_it() -> None:
    guide = (REPO / "docs" / "guides" / "extending.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in guide.splitlines()
            if line.startswith("| `")}
    for name in CONTEXT_CAPABILITIES:
        assert name in rows, f"docs/guides/extending.md: no row for {name}"
        offered_by = rows[name].split("|")[4]
        hosts = {n for n in BUILTIN_LAUNCHERS if name in launcher_offers(n)}
        assert {n for n in BUILTIN_LAUNCHERS if f"`{n}`" in offered_by} == hosts, name


def test_docker_does_not_inherit_what_only_local_nodes_offer() -> None:
    assert {"services", "host_loopback", "node_gpu_state"} & DockerTarget.offers == set()
    assert JobContext.offers == frozenset()  # an attached job: the core only


# -- the load error -----------------------------------------------------------------------------


def _one_fault(fault: str, launcher: str, target: str = "{node: 1}") -> str:
    return (f"name: x\ntopology: {{nodes: 2, launcher: {launcher}}}\nfaults:\n"
            f"  - type: {fault}\n    target: {target}\n    trigger: {{at_step: 5}}\n"
            f"    duration_s: 10\n")


def test_a_fault_whose_capability_the_launcher_lacks_is_refused_with_why_and_where() -> None:
    with pytest.raises(InvalidExperimentError) as err:
        parse_experiment(_one_fault("network_partition", "local"), "x.yaml")
    [problem] = err.value.problems
    assert (problem.line, problem.path) == (4, "faults[0].type")
    assert problem.message == (
        f"network_partition needs node_network "
        f"({CONTEXT_CAPABILITIES['node_network'].description}), which launcher 'local' does "
        f"not offer; launchers that do: docker, netns")  # netns: examples/plugin (make)


def test_the_same_fault_validates_where_the_capability_is_offered() -> None:
    exp = parse_experiment(_one_fault("node_pause", "docker"), "x.yaml")
    assert exp.faults[0].type == "node_pause"
    with pytest.raises(InvalidExperimentError, match="needs node_freezer .*launchers that do: "
                                                     "docker"):
        parse_experiment(_one_fault("node_pause", "local"), "x.yaml")


# -- at injection: the second line ---------------------------------------------------------------


class _CoreOnly(JobContext):
    """A job of this host's that offers the core only (an attached job, a team's target)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def agent_pids(self) -> dict[str, int]:
        return {"node0": os.getpid(), "node1": os.getpid()}


def test_a_fault_is_refused_at_injection_where_its_capability_is_not_offered(
        tmp_path: Path) -> None:
    ctx = _CoreOnly(tmp_path)
    pause = NodePauseFault(NodePauseFault.Params())
    with pytest.raises(FaultError, match=r"node_pause needs node_freezer \(a cgroup freezer.*"
                                         r"which _CoreOnly \(the job in .*\) does not offer"):
        pause.inject(ctx, Victim("node", 1))
    assert pause.undo(ctx) == {"unpaused": []}  # nothing paused, nothing asked of the target
    cut = NetworkPartitionFault(NetworkPartitionFault.Params())
    with pytest.raises(FaultError, match="needs node_network"):
        cut.inject(ctx, Victim("node", 1))
    kill = ServiceKillFault(ServiceKillFault.Params(service="lighthouse"))
    with pytest.raises(FaultError, match="service_kill needs services"):
        kill.inject(ctx, Victim("all"))


def test_the_targets_capability_methods_raise_where_it_does_not_offer_them(
        tmp_path: Path) -> None:
    ctx = _CoreOnly(tmp_path)
    with pytest.raises(FaultError, match="pausing a node needs the node_freezer capability, "
                                         r"which _CoreOnly .* does not offer \(it offers: the "
                                         r"core only\)"):
        ctx.pause_node("node0")
    with pytest.raises(FaultError, match="needs the node_network capability"):
        ctx.node_netns_pid("node0")
    with pytest.raises(FaultError, match="needs the node_restart capability"):
        ctx.restart_node("node0")


def test_require_takes_a_test_double_without_offers_at_its_word() -> None:
    class Double:  # the methods of node_freezer, no ``offers``
        def pause_node(self, node: str) -> None: ...
        def unpause_node(self, node: str) -> bool: return True

    assert require(Double(), "node_freezer") is not None  # type: ignore[arg-type]
    with pytest.raises(FaultError, match="needs node_network"):
        require(Double(), "node_network")  # type: ignore[arg-type]
    assert require(Double(), "host_loopback") is not None  # type: ignore[arg-type]


# -- a team's target and fault, registered as pip would install them ---------------------------

TEAM_TARGETS = '''
from faultlab.targets.local import LocalTarget


class BareTarget(LocalTarget):
    """Nodes somewhere this host reaches only through the core: no capability offered."""

    offers = frozenset()


class NettedTarget(LocalTarget):
    """The team's nodes, each with a network of its own."""

    offers = LocalTarget.offers | {"node_network"}
'''

TEAM_FAULT = '''
from typing import ClassVar

from faultlab.faults import Fault


class NetPauseFault(Fault):
    """Freeze a node and cut its link at once."""

    type = "team_netpause"
    family = "network"
    targets = ("node",)
    needs: ClassVar[tuple[str, ...]] = ("node_network", "node_freezer")

    def inject(self, ctx, victim):
        return {}
'''


@pytest.fixture(scope="module")
def team_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    team_package(site, "team_targets", TEAM_TARGETS, "faultlab.targets",
                 "bare = team_targets:BareTarget\nnetted = team_targets:NettedTarget")
    return team_package(site, "team_fault", TEAM_FAULT, "faultlab.faults",
                        "team_netpause = team_fault:NetPauseFault")


def test_a_team_target_hosts_the_builtin_faults_it_offers_what_they_need(
        team_site: Path) -> None:
    docs = {"core_on_bare": _one_fault("rank_kill", "bare", "{rank: 0}").replace(
                "    duration_s: 10\n", ""),
            "net_on_bare": _one_fault("network_partition", "bare"),
            "net_on_netted": _one_fault("network_partition", "netted"),
            "two_on_bare": _one_fault("team_netpause", "bare").replace(
                "    duration_s: 10\n", "")}
    for name, text in docs.items():
        (team_site / f"{name}.yaml").write_text(text)
    out = {name: run_with(team_site, "-m", "faultlab.cli", "validate", f"{name}.yaml",
                          check=False) for name in docs}
    assert out["core_on_bare"].returncode == 0, out["core_on_bare"].stderr
    assert out["net_on_netted"].returncode == 0, out["net_on_netted"].stderr
    refused = " ".join(out["net_on_bare"].stderr.split())
    assert out["net_on_bare"].returncode != 0
    assert "net_on_bare.yaml:4 faults[0].type: network_partition needs node_network (nodes " \
           "with a network stack of their own" in refused
    # netns: examples/plugin's target, which make installs into the venv
    assert "which launcher 'bare' does not offer; launchers that do: docker, netns, netted" \
        in refused
    both = " ".join(out["two_on_bare"].stderr.split())
    assert "team_netpause needs node_network (" in both and ") and node_freezer (" in both
    assert "launchers that offer all it needs: docker" in both


BROKEN = '''
from faultlab.targets.local import LocalTarget
from faultlab.faults import Fault


class TypoTarget(LocalTarget):
    offers = frozenset({"node_netwrk"})


class OldFault(Fault):
    """A fault written for the launcher list."""

    type = "team_old"
    family = "process"
    launchers = ("local",)

    def inject(self, ctx, victim):
        return {}
'''


def test_a_plugin_that_offers_or_lists_what_faultlab_does_not_read_is_an_error(
        tmp_path: Path) -> None:
    site = team_package(tmp_path, "team_broken", BROKEN, "faultlab.targets",
                        "typo = team_broken:TypoTarget")
    (site / "x.yaml").write_text(_one_fault("network_partition", "typo"))
    out = run_with(site, "-m", "faultlab.cli", "validate", "x.yaml", check=False)
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode != 0
    assert "target plugin 'team-broken 0.1' (entry point typo = team_broken:TypoTarget in " \
           "faultlab.targets) offers 'node_netwrk', which is no context capability" in said
    info = site / "team_broken-0.1.dist-info" / "entry_points.txt"
    info.write_text("[faultlab.faults]\nteam_old = team_broken:OldFault\n")
    out = run_with(site, "-m", "faultlab.cli", "list", "faults", check=False)
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode != 0
    assert "fault plugin 'team-broken 0.1' (entry point team_old = team_broken:OldFault in " \
           "faultlab.faults) declares launchers, which faultlab no longer reads: declare what " \
           "it needs of the target instead" in said


def test_the_launchers_are_the_registered_targets() -> None:
    assert set(BUILTIN_LAUNCHERS) <= set(launcher_names())
