"""The job under test and its shape: ``target`` (which trainer), ``topology`` (nodes, ranks,
backend, launcher) and ``run`` (steps, checkpoint interval, timeout).

Each model checks only itself; the rules that tie these sections to the faults (a rank inside
the world size, a trigger inside the run) and the trainer's config to ``run`` are the whole
document's, in ``faultlab.spec.model``.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails

from faultlab.errors import PluginError
from faultlab.fault_api.context import declared_capabilities, unmet
from faultlab.spec._base import (
    SpecModel,
    as_tuple,
    located,
    relocate,
    show,
    spec_error,
    unknown,
)
from faultlab.spec._trainer import check_overrides
from faultlab.spec.launch import (
    LAUNCHERS,
    PLACEHOLDERS,
    SERVICE_NAME,
    TORCHRUN_DEFAULT,
    fixed_port,
    launcher_index,
    program,
    rendezvous_client,
    service_placeholder,
    split_line,
    unknown_placeholders,
)
from faultlab.spec.trainers import get_trainer, trainers

__all__ = ["PYTHON_NAMES", "RunSpec", "TargetSpec", "Topology", "launcher_class", "launcher_names",
           "launcher_offers", "launchers_offering"]

PYTHON_NAMES = ("python", "python3")
"""A command starting with one of these runs on the interpreter (and virtual environment)
faultlab itself runs on."""


class TargetSpec(SpecModel):
    """The job under test: a registered trainer (the bundled reference trainer by default), or
    your own trainer's command."""

    trainer: str | None = None
    """A trainer registered under the ``faultlab.trainers`` entry point: ``reference``, the
    bundled FSDP2 trainer, is the default unless ``command`` is given."""
    preset: str | None = None
    """Model preset of the trainer (its plugin's ``presets``; the first is the default)."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """The trainer's settings by config field name, e.g. ``global_batch: 12``."""
    command: Annotated[tuple[str, ...], Field(min_length=1)] | None = None
    """Your trainer's command (a list, or a string split like a shell would), run unchanged
    under torchrun by faultlab, which observes it through its runtime agent (level 0).
    ``{run_dir}`` in an argument stands for each launch's own run directory (``--ckpt-dir
    {run_dir}/checkpoints``), so the golden run and the experiment never share checkpoints; a
    bare ``python`` is the interpreter (and virtual environment) faultlab itself runs on."""

    services: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    """Processes the team runs beside the nodes, by name (``lighthouse:
    [torchft_lighthouse, --min_replicas, "1", --bind, "[::]:{lighthouse_port}"]``): each is
    started before the nodes, in a session of its own, with a free port of its own in
    ``{NAME_port}`` (in its line and in the launch line), and always reaped with the job. A
    node's loss never touches one; ``service_kill`` does. Local nodes only."""
    launch: str | tuple[str, ...] | None = None
    """How each node is started (``faultlab.spec.launch``): ``torchrun`` (plain torchrun,
    torchrun's own defaults; the default for ``command``), ``faultlab`` (faultlab's tuned
    launcher; the reference trainer's default), or your own launch line, a list or a string,
    with placeholders faultlab fills per node and per launch: ``{node_rank}``, ``{nnodes}``,
    ``{rdzv_endpoint}``, ``{master_addr}``, ``{master_port}``, ``{run_dir}`` ... The command
    follows the line on each node."""
    checkpoint_dir: str | None = None
    """Where your trainer (``command``) writes its checkpoints, under ``{run_dir}``
    (``{run_dir}/hf``): the directory the storage faults act on. Needed only when no argument
    of ``command`` names it by a name faultlab knows (``--ckpt-dir``, ``--output-dir`` ...:
    ``faultlab.spec.checkpoint_args``); when set, it wins over them. The reference trainer's
    is ``{run_dir}/checkpoints``."""

    @model_validator(mode="before")
    @classmethod
    def _reference_by_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("command") is None:
            data = dict(data)
            if data.get("trainer") is None:
                data["trainer"] = "reference"
            name = data["trainer"]
            if data.get("preset") is None and isinstance(name, str) and name in trainers():
                # the trainer's first preset is its default
                data["preset"] = get_trainer(name).presets[0]
        return data

    @field_validator("trainer", mode="before")
    @classmethod
    def _trainer(cls, value: Any) -> Any:
        if value is not None and (not isinstance(value, str) or value not in trainers()):
            others = [n for n in trainers() if n != "reference"]
            also = f" (registered: {', '.join(others)})" if others else ""
            raise ValueError(f"unknown trainer {show(value)}: the bundled trainer is "
                             f"'reference'{also}; to run your own trainer, set command: [...] "
                             f"instead")
        return value

    @field_validator("preset")
    @classmethod
    def _preset(cls, value: str | None, info: ValidationInfo) -> str | None:
        name = info.data.get("trainer")
        if value is not None and name is not None:
            presets = get_trainer(name).presets
            if value not in presets:
                raise ValueError(unknown("preset", value, presets, "choose from"))
        return value

    @field_validator("overrides")
    @classmethod
    def _overrides(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("trainer")
        if name is None:
            return value  # a command target: _one_kind reports overrides
        converted, errors = check_overrides(get_trainer(name), value)
        if errors:
            raise located(errors)
        return converted

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as e:
                raise ValueError(f"cannot split {show(value)} into arguments: {e}; write "
                                 f"it as a list instead") from None
        return as_tuple(value)

    @field_validator("command")
    @classmethod
    def _command_found(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        # Every rank would fail the same way, restart after restart: refuse it here.
        if not value:
            return value
        exe = value[0]
        if exe not in PYTHON_NAMES and shutil.which(exe) is None:
            raise ValueError(f"{show(exe)} is not found: not on PATH, and no executable file "
                             f"of that name (relative paths start from the directory faultlab "
                             f"runs in, {show(str(Path.cwd()))})")
        script = value[1] if len(value) > 1 else ""
        if Path(exe).name.startswith("python") and script.endswith(".py") and \
                not Path(script).is_file():
            raise ValueError(f"{show(script)}: no such file (relative paths start from the "
                             f"directory faultlab runs in, {show(str(Path.cwd()))})")
        return value

    @field_validator("services", mode="before")
    @classmethod
    def _services_split(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        for name, line in value.items():
            try:
                line = tuple(shlex.split(line)) if isinstance(line, str) else as_tuple(line)
            except ValueError as e:
                raise located([spec_error((name,), f"cannot split {show(line)} into arguments: "
                                          f"{e}; write it as a list instead", line)]) from None
            out[name] = line
        return out

    @field_validator("services")
    @classmethod
    def _services(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        errors = []
        for name, line in value.items():
            if not SERVICE_NAME.fullmatch(name):
                errors.append(spec_error((name,), f"{name!r} is not a service name: use lower-"
                                         f"case letters, digits and '_', starting with a "
                                         f"letter (its port is {{NAME_port}})", name))
                continue
            if not line:
                errors.append(spec_error((name,), "an empty line; give the service's program "
                                         "and its flags", list(line)))
                continue
            ports = ", ".join("{" + service_placeholder(n) + "}" for n in value)
            for i, ph in unknown_placeholders(line, services=list(value)):
                errors.append(spec_error((name, i), f"{{{ph}}} is not a placeholder faultlab "
                                         f"fills in a service's line; it fills {{run_dir}}, "
                                         f"{{num_nodes}} and each service's port: {ports}",
                                         line[i]))
            for i, arg in enumerate(line):
                for ph in set(PLACEHOLDERS) - {"run_dir", "num_nodes"}:
                    if f"{{{ph}}}" in arg:
                        errors.append(spec_error((name, i), f"{{{ph}}} is a node's or the "
                                                 f"rendezvous's; a service runs once for the "
                                                 f"whole job", arg))
            if program(line[0]) is None:
                errors.append(spec_error((name, 0), f"{line[0]!r} is not found: not on PATH, "
                                         f"and no executable file of that name (install it as "
                                         f"its users do, e.g. pip install ...)", line[0]))
        if errors:
            raise located(errors)
        return value

    @field_validator("launch", mode="before")
    @classmethod
    def _launch_split(cls, value: Any) -> Any:
        try:
            value = split_line(value)
        except ValueError as e:
            raise ValueError(f"cannot split {show(value)} into arguments: {e}; write it as a "
                             f"list instead") from None
        return as_tuple(value) if isinstance(value, list) else value

    @field_validator("launch")
    @classmethod
    def _launch(cls, value: str | tuple[str, ...] | None, info: ValidationInfo,
                ) -> str | tuple[str, ...] | None:
        if value is None:
            return value
        if isinstance(value, str):
            if value not in LAUNCHERS:  # a one-word line: a launcher that takes no flags
                value = (value,)
            else:
                return value
        if not value:
            raise ValueError(f"an empty launch line; give {' or '.join(map(repr, LAUNCHERS))} "
                             f"or your launcher and its flags")
        services = list(info.data.get("services") or {})
        fills = [*PLACEHOLDERS, *(service_placeholder(n) for n in services)]
        services_refused = "services" not in info.data  # reported there: no second error
        errors = [spec_error((i,), f"{{{name}}} is not a placeholder faultlab fills; it fills "
                             f"{', '.join('{' + p + '}' for p in fills)}"
                             + (" (a service's port: name the service under target.services)"
                                if name.endswith("_port") and name not in PLACEHOLDERS else ""),
                             value[i])
                  for i, name in unknown_placeholders(value, services)
                  if not (services_refused and name.endswith("_port"))]
        fixed = fixed_port(value)
        if fixed is not None:
            i, literal = fixed
            service = "{" + service_placeholder(services[0] if services else "store") + "}"
            # the agents dial a store or etcd that is not theirs
            if ":" in literal and rendezvous_client(value):
                why = (f"{literal!r} is a fixed port: the golden run, every run and runs in "
                       f"parallel would share the store or etcd there, and each other's "
                       f"rendezvous with it; run it as a target.services entry and write "
                       f"127.0.0.1:{service} (faultlab gives each launch's service a free port)")
            else:
                why = (f"{literal!r} is a fixed port: the golden run, every run and runs in "
                       f"parallel would all bind it; write "
                       f"{'{rdzv_endpoint}' if ':' in literal else '{master_port}'} and "
                       f"faultlab gives each launch a free one (a store or etcd of your own: a "
                       f"target.services entry, at 127.0.0.1:{service})")
            errors.append(spec_error((i,), why, literal))
        at = launcher_index(value)
        exe = value[at] if at < len(value) else value[0]
        if program(exe) is None:
            errors.append(spec_error((at,), f"{exe!r} is not found: not on PATH, and no executable "
                                     f"file of that name (install it as its users do, e.g. "
                                     f"pip install ...)", exe))
        if errors:
            raise located(errors)
        return value

    @field_validator("checkpoint_dir")
    @classmethod
    def _checkpoint_dir(cls, value: str | None) -> str | None:
        if value is None:
            return value
        rest = value[len("{run_dir}"):] if value.startswith("{run_dir}") else None
        if rest is None or (rest and not rest.startswith("/")) or ".." in rest.split("/"):
            raise ValueError(f"{show(value)} is not inside each run's own directory: start it "
                             f"with {{run_dir}} (e.g. '{{run_dir}}/checkpoints'), as the "
                             f"trainer's argument does, so the golden run and every run keep "
                             f"their own checkpoints")
        return value.rstrip("/") or value

    @model_validator(mode="after")
    def _one_kind(self) -> TargetSpec:
        if self.command is None:
            if self.checkpoint_dir is not None:
                raise located([spec_error(("checkpoint_dir",), "checkpoint_dir is for your own "
                                          "trainer (command); the reference trainer's is "
                                          "{run_dir}/checkpoints", self.checkpoint_dir)])
            return self
        errors = []
        if self.trainer is not None:
            errors.append(spec_error(("command",), "set either trainer (the bundled "
                                     "reference trainer) or command (your own), not both",
                                     list(self.command)))
        for key in ("preset", "overrides"):
            if getattr(self, key):
                errors.append(spec_error((key,), f"{key} applies to the reference trainer "
                                         f"only; pass your trainer's own flags in command",
                                         getattr(self, key)))
        if errors:
            raise located(errors)
        return self

    @property
    def is_reference(self) -> bool:
        return self.command is None

    def launch_line(self, launcher: str | None = None) -> tuple[str, ...] | None:
        """The line that starts each node on ``topology.launcher`` (None: a target whose nodes
        start with a line): None for faultlab's tuned launcher (``launch: faultlab``, the
        reference trainer's default; on a target whose class says ``launch_lines = False``,
        Slurm's, its own way starts the nodes), else the line with its placeholders (``launch:
        torchrun`` is ``TORCHRUN_DEFAULT``, with ``--no-python`` for a command that is not a
        Python script). A command with no ``launch`` runs under plain torchrun on local and
        docker nodes alike: inside a container it is the same line the team runs on a
        machine."""
        launch = self.launch
        if launch is None:
            lines = launcher is None or getattr(launcher_class(launcher), "launch_lines", True)
            launch = "faultlab" if self.is_reference or not lines else "torchrun"
        if launch == "faultlab":
            return None
        if launch == "torchrun":
            line = TORCHRUN_DEFAULT
            command = self.command or ("python", "train.py")
            script = Path(command[0]).name.startswith("python") and len(command) > 1 and \
                command[1] != "-c"
            if not script:  # torchrun runs a script or a module with python, nothing else
                line = (*line, "--no-python")
            return line
        assert isinstance(launch, tuple)
        return launch


# -------------------------------------------------------------------------- topology, run


def launcher_names() -> list[str]:
    """The names ``topology.launcher`` takes: the ``faultlab.targets`` entry points (read,
    not imported: the spec imports no target module of its own accord; ``launcher_offers``
    loads one through its entry point)."""
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group="faultlab.targets")})


@cache
def launcher_class(name: str) -> type:
    """The target class registered as ``name`` in the ``faultlab.targets`` entry-point group,
    its module imported now (``faultlab.targets.target_class`` checks it is a ``Target``); a
    name nobody registered, or a plugin that fails to import, is a PluginError that names it,
    never skipped."""
    from importlib.metadata import entry_points

    eps = {ep.name: ep for ep in entry_points(group="faultlab.targets")}
    if name not in eps:
        raise PluginError(f"no target registered as {name!r} (the faultlab.targets entry "
                          f"points: {', '.join(sorted(eps)) or 'none'}; is faultlab installed?)")
    try:
        cls: type = eps[name].load()
    except Exception as e:  # a plugin's import error must be seen, not swallowed
        raise PluginError(f"target plugin {name!r} ({eps[name].value}) failed to import: "
                          f"{type(e).__name__}: {e}") from e
    return cls


@cache
def launcher_offers(name: str) -> frozenset[str]:
    """The context capabilities (``faultlab.fault_api.context``) the target registered as
    ``name`` offers: its class's ``offers``, the core only where it declares none. Its module
    is loaded (``launcher_class``) only when a fault needs something beyond the core; offering
    what is no capability is a PluginError that names it."""
    cls = launcher_class(name)
    return declared_capabilities(getattr(cls, "offers", frozenset()),
                                 f"target plugin {name!r} ({cls.__module__}:{cls.__qualname__})",
                                 "offers")


def launchers_offering(needs: Iterable[str]) -> list[str]:
    """The registered launchers whose target offers every one of ``needs``."""
    needs = tuple(needs)
    return [n for n in launcher_names() if not unmet(needs, launcher_offers(n))]


def _parse_settings(launcher: Any, block: Any) -> tuple[Any, list[InitErrorDetails]]:
    """``block`` parsed by the settings model of the target registered as ``launcher``
    (``Target.settings``; ``{}`` where absent), with its errors located under its key; None
    where the class declares no model (a block for it is then an error)."""
    if not isinstance(launcher, str) or launcher not in launcher_names():
        return None, []  # the launcher's own error says so
    model = getattr(launcher_class(launcher), "settings", None)
    if model is None:
        if block is None:
            return None, []
        return None, [spec_error((launcher,), f"the {launcher} target declares no settings "
                                 f"(its class has no settings model): remove the block",
                                 block)]
    try:
        return model.model_validate({} if block is None else block), []
    except ValidationError as e:
        return None, relocate(e, (launcher,))


class Topology(SpecModel):
    """Shape of the job: ``nodes`` torchrun agents with ``procs_per_node`` ranks each."""

    nodes: int = Field(default=2, ge=1)
    """Number of nodes (torchrun agents)."""
    procs_per_node: int = Field(default=1, ge=1)
    """Ranks per node."""
    min_nodes: int | None = Field(default=None, ge=1)
    """Fewest nodes the job may shrink to (elastic); ``null`` means ``nodes`` (no shrinking)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Process-group backend; ``auto`` is NCCL with a GPU, else gloo."""
    max_restarts: int = Field(default=3, ge=0)
    """Restarts torchrun allows the job before it gives up."""
    launcher: Annotated[str, Field(json_schema_extra={"enum": launcher_names()})] = "local"
    """Where the nodes run: a target registered under the ``faultlab.targets`` entry-point
    group. Built in: ``local`` (torchrun agents on this host, sharing its network), ``docker``
    (one container per node on a bridge network of its own; needs a Docker engine, and is what
    the ``network`` faults and ``node_pause`` act on) or ``slurm`` (a batch job on a Slurm
    cluster, one node per allocated host); a team's own is named the same way. A target's own
    settings go in a block named after it (``slurm:`` for ``launcher: slurm``: the model its
    class declares, ``Target.settings``), parsed into ``settings``."""

    _settings: Any = PrivateAttr(default=None)

    @model_serializer(mode="wrap")
    def _with_settings(self, handler: SerializerFunctionWrapHandler,
                       info: SerializationInfo) -> Any:
        """The fields, and the settings block under the launcher's name as it was written
        (a campaign's runs and the journal's document load it back)."""
        data = handler(self)
        if self._settings is not None and isinstance(data, dict):
            data[self.launcher] = self._settings.model_dump(
                mode=info.mode, exclude_none=info.exclude_none,
                exclude_defaults=info.exclude_defaults, exclude_unset=info.exclude_unset)
        return data

    @classmethod
    def valid_keys(cls) -> tuple[str, ...]:
        """The fields, then each registered launcher whose target declares settings (its
        block)."""
        blocks = [n for n in launcher_names() if cls.block_model(n) is not None]
        return (*cls.model_fields, *blocks)

    @classmethod
    def block_model(cls, key: str) -> type[BaseModel] | None:
        """The settings model of the block ``key`` (a launcher's name), None if none."""
        if key in cls.model_fields or key not in launcher_names():
            return None
        model = getattr(launcher_class(key), "settings", None)
        return model if isinstance(model, type) and issubclass(model, BaseModel) else None

    @property
    def settings(self) -> Any:
        """The target's own settings: its block ``topology.<launcher>:`` (``slurm:`` ...)
        parsed by the model its class declares (``Target.settings``), the defaults where the
        block is absent; None where the class declares no model."""
        return self._settings

    @field_validator("launcher")
    @classmethod
    def _registered(cls, value: str) -> str:
        names = launcher_names()
        if value not in names:
            raise ValueError(unknown("launcher", value, names,
                                     "registered (faultlab.targets entry points)"))
        return value

    @model_validator(mode="after")
    def _min_nodes(self) -> Topology:
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise located([spec_error(("min_nodes",), f"min_nodes ({self.min_nodes}) cannot "
                                      f"exceed nodes ({self.nodes})", self.min_nodes)])
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _settings_block(cls, data: Any, handler: ModelWrapValidatorHandler[Topology]
                        ) -> Topology:
        """Take the settings block out (its key is a launcher's name, not a field), validate
        the rest, then the block by its target's model: the errors of both at once."""
        if not isinstance(data, dict):
            return handler(data)
        names = set(launcher_names()) - set(cls.model_fields)
        blocks = {k: v for k, v in data.items() if k in names}
        errors: list[InitErrorDetails] = []
        topology = None
        try:
            topology = handler({k: v for k, v in data.items() if k not in blocks})
        except ValidationError as e:
            errors += relocate(e, ())
        launcher = data.get("launcher", cls.model_fields["launcher"].default)
        for name in blocks:
            if name != launcher:
                errors.append(spec_error((name,), f"a {name} block is the settings of "
                                         f"launcher {name!r}; this topology's launcher is "
                                         f"{launcher!r}: set launcher: {name}, or remove the "
                                         f"block", blocks[name]))
        settings, problems = _parse_settings(launcher, blocks.get(launcher))
        errors += problems
        if errors or topology is None:
            raise located(errors, "Topology")
        topology._settings = settings
        return topology

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def effective_min_nodes(self) -> int:
        return self.nodes if self.min_nodes is None else self.min_nodes


class RunSpec(SpecModel):
    """How long the experiment runs."""

    steps: int = Field(default=40, ge=1)
    """Training steps of the run (the schedule horizon)."""
    checkpoint_every: int = Field(default=10, ge=1)
    """Checkpoint after every N steps."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Wall-clock limit of the whole experiment; past it the job is stopped and fails."""
    control_channel: Literal["socket", "file"] = "socket"
    """How each node's relay (``faultlab.runtime.relay``) reaches faultlab. ``socket``: a
    connection per node to faultlab's host, events pushed, gates and commands broadcast;
    ``file``, for a cluster whose nodes reach the submit host only through the shared
    filesystem: one batched event file per node, read by faultlab, and one gates file. Either
    way no rank touches the shared filesystem for faultlab's control plane."""
