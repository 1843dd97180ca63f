"""``sdc`` inside a rank: wrong but finite numbers where ``surface`` says, every step.

The rank-side action (``faultlab.runtime.hooks``, ``strikes = "window"``: active from the
trigger step to the end of the job) of ``faultlab.faults.sdc``. Its torch hooks live as long as
it is active; every call is an *opportunity* to strike:

``activation``
    A forward hook on each module ``module_glob`` names (default: every ``torch.nn.Linear``)
    under the rank's outermost module (at level 0: the module of the first training forward).
    The output is replaced by one whose chosen elements are wrong; the gradient flows through
    as if nothing happened (a bad device's backward does not know either). Only plain tensor
    outputs are hit. A glob that matches no module is ``fault_failed`` at activation, with the
    module names it saw.
``gradient``
    A tensor hook (``param.register_hook``) on each parameter ``param_glob`` names: the
    gradient autograd computed on this rank, before it is accumulated into ``.grad``, so before
    DDP's all-reduce (or a trainer's own) averages it into every replica. A sharded FSDP2
    parameter (a DTensor) gets its gradient through the reduce-scatter instead: there the
    reduce-scatter's input (every parameter's unsharded gradient of the FSDP group, flat) is
    corrupted before it is issued, through the collective interposer (``where`` names the
    operation; ``param_glob`` only chooses whether any sharded parameter is hit).
``update``
    A post-hook on the optimizer step: the local shards of the chosen parameters right after
    the step, so this replica's weights leave the others'.
``weights``
    At step start, the local shards of the chosen parameters in memory.

How the elements and the noise are chosen (``persistence``): ``deterministic`` seeds them from
the fault's seed, the rank and a CRC-32 of the *input* (the module's input, the uncorrupted
gradient or parameter): the same input gives the same wrong value, so a replay of the step on
this rank agrees with itself. ``intermittent`` draws each opportunity's chance and choice from a
``random.Random`` stream seeded by (seed, fault id, rank) that advances per call: a replay draws
anew. ``once`` strikes each target once per step, and a step struck once is never struck again,
by this process (a replay, a rollback) or a restarted one (a marker: ``rank.claim``).

``lifetime``: ``job`` strikes in every process; ``process`` only in the first process of the rank
to activate it (``rank.claim``); ``node`` marks the node of each victim rank's first process
(``rank.mark_node``) and strikes in whatever process runs on a marked node.

Every strike is counted into one ``fault_struck`` record per step (elements hit, how many
changed value, where), written right after the step's optimizer step (at level 0 before the
step's own record), else at the next step start or when the action ends; the first strike also
emits ``fault_injected``.
"""

from __future__ import annotations

import fnmatch
import random
import threading
import time
import zlib
from typing import Any

import torch

from faultlab.runtime.actions.numeric import choose_params, local_shard
from faultlab.runtime.hooks import ActionError, RankAction

__all__ = ["Sdc", "corrupt", "input_hash", "pick"]

_MASK63 = (1 << 63) - 1
_GRAD_REDUCE_OPS = ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")
_PROCESS_OWNED: set[str] = set()  # fault ids whose process lifetime this process holds


def input_hash(t: Any) -> int:
    """CRC-32 of a tensor's bytes (a DTensor's local shard); 0 for anything else."""
    if not isinstance(t, torch.Tensor):
        return 0
    local = local_shard(t).detach().contiguous().view(-1)
    return zlib.crc32(local.view(torch.uint8).cpu().numpy().tobytes())


def pick(numel: int, p: dict[str, Any], g: torch.Generator) -> torch.Tensor:
    """The flat indices hit in a tensor of ``numel`` elements: ``num_elements`` (or
    ``fraction`` of them, at least one), distinct, at most all."""
    n = max(1, round(p["fraction"] * numel)) if p.get("fraction") else p["num_elements"]
    n = min(n, numel)
    if numel <= 1 << 22:
        return torch.randperm(numel, generator=g)[:n]
    return torch.randint(numel, (n,), generator=g).unique()


def corrupt(values: torch.Tensor, p: dict[str, Any], g: torch.Generator) -> torch.Tensor:
    """``values`` (1-D) made wrong as ``op`` says: a new tensor of the same dtype."""
    op, m = p["op"], float(p.get("magnitude") or 0.0)
    if op == "sign_flip":
        return -values
    if op == "scale":
        return (values.double() * (1.0 + m)).to(values.dtype)
    if op == "noise":
        z = torch.randn(values.numel(), generator=g, dtype=torch.float64).to(values.device)
        return (values.double() + m * values.double().abs() * z).to(values.dtype)
    bit, size = p["bit_index"], values.element_size()
    if bit >= 8 * size:
        raise ActionError(f"bit_index {bit} is outside the {8 * size}-bit elements "
                          f"({values.dtype}); use 0..{8 * size - 1}")
    out = values.clone()
    as_bytes = out.view(torch.uint8).view(-1, size)  # little-endian element layout
    as_bytes[:, bit // 8] ^= 1 << (bit % 8)
    return out


class Sdc(RankAction):
    """``sdc`` (module docstring)."""

    strikes = "window"
    needs_model = True

    def __init__(self, entry: Any, rank: Any) -> None:
        super().__init__(entry, rank)
        p = self.params
        self.surface: str = p["surface"]
        self._rng = random.Random(f"{p['seed']}/{entry.id}/{rank.rank}")
        self._lock = threading.Lock()
        self._pending: dict[int, dict[str, Any]] = {}
        self._once: set[tuple[str, int]] = set()
        self._owned_steps: set[int] = set()
        self._broken = False
        self._sharded = False  # gradient on FSDP2 parameters: through the reduce-scatter
        self._on = self._holds_lifetime()

    # --- lifetime -----------------------------------------------------------------------------

    def _holds_lifetime(self) -> bool:
        lifetime, rank = self.params["lifetime"], self.rank
        if lifetime == "process":
            if self.entry.id in _PROCESS_OWNED or rank.claim("process"):
                _PROCESS_OWNED.add(self.entry.id)
                return True
            return False
        if lifetime == "node":
            victims = self.params.get("victim_ranks")
            if (victims is None or rank.rank in victims) and rank.claim("victim"):
                rank.mark_node()
            return rank.node_marked()
        return True

    # --- the hooks ----------------------------------------------------------------------------

    def on_step_start(self, step: int) -> None:
        self._flush()
        if not self._on and self.params["lifetime"] == "node":
            self._on = self.rank.node_marked()  # another rank's process marked it since
        if self.surface == "weights":
            self._guard(self._params_strike)
            self._flush()

    def after_optimizer_step(self, optimizer: Any) -> None:
        if self.surface == "update":
            self._guard(self._params_strike)
        self._flush()  # the step's compute is over: its record is complete

    def modules_to_watch(self) -> list[tuple[str, Any]]:
        if self.surface != "activation":
            return []
        named = list(self.rank.model.named_modules())
        glob = self.params.get("module_glob")
        hit = [(n, m) for n, m in named if (isinstance(m, torch.nn.Linear) if glob is None
                                            else fnmatch.fnmatchcase(n, glob))]
        if not hit:
            seen = ", ".join(repr(n) for n, _ in named[:20]) or "none (no forward seen yet)"
            more = " ..." if len(named) > 20 else ""
            wanted = "no torch.nn.Linear" if glob is None else f"no module matches {glob!r}"
            raise ActionError(f"sdc surface activation: {wanted} under the rank's outermost "
                              f"module; the modules it saw: {seen}{more}; set "
                              f"params.module_glob to one of them (fnmatch patterns)")
        return hit

    def after_module_forward(self, name: str, module: Any, args: Any, output: Any) -> Any:
        if type(output) is not torch.Tensor or not output.is_floating_point():
            return None
        seed = self._opportunity(name, args[0] if args else None)
        if seed is None:
            return None
        flat = output.reshape(-1)
        with torch.no_grad():
            wrong = self._guard(self._wrong, name, flat.detach().clone(), seed)
        if wrong is None:
            return None
        return (flat - flat.detach() + wrong).view_as(output) if flat.requires_grad \
            else wrong.view_as(output)

    def grads_before_reduce(self) -> list[tuple[str, Any]]:
        if self.surface != "gradient":
            return []
        chosen = self._chosen()
        self._sharded = any(hasattr(p, "_local_tensor") for _, p in chosen)
        return [(n, p) for n, p in chosen if not hasattr(p, "_local_tensor")]

    def on_local_grad(self, name: str, grad: Any) -> Any:
        seed = self._opportunity(name, grad)
        if seed is None:
            return None
        with torch.no_grad():
            wrong = grad.detach().clone()
            return wrong if self._guard(self._wrong, name, wrong.view(-1), seed) is not None \
                else None

    def matches(self, op: str) -> bool:
        """FSDP2's gradient reduce-scatter (not DTensor's functional ones: activations)."""
        return self._sharded and op in _GRAD_REDUCE_OPS

    def before_collective(self, call: Any) -> None:
        t = call.argument("input")
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return
        seed = self._opportunity(call.op, t)
        if seed is not None:
            with torch.no_grad():
                self._guard(self._wrong, call.op, t.view(-1), seed)

    def release(self) -> dict[str, Any]:
        summary = super().release()
        self._flush()
        return summary

    # --- striking -----------------------------------------------------------------------------

    def _chosen(self) -> list[tuple[str, Any]]:
        glob = self.params.get("param_glob") or "*"
        return choose_params(self.rank.model, glob, 1.0, random.Random(0))

    def _params_strike(self) -> None:
        """Weights or update: one opportunity (one intermittent draw) for every chosen
        parameter's local shard."""
        if self.params["persistence"] == "intermittent" and not self._draw():
            return
        with torch.no_grad():
            for name, param in self._chosen():
                local = local_shard(param.data)
                seed = self._opportunity(name, local, draw=False)
                if seed is not None:
                    self._wrong(name, local.view(-1), seed)

    def _draw(self) -> bool:
        """Does this opportunity strike (``intermittent``)? The stream advances per call."""
        return self._rng.random() < self.params["probability"]

    def _opportunity(self, name: str, data: Any, draw: bool = True) -> int | None:
        """The seed of this strike, or None: this opportunity does not strike."""
        if not self._on or self._broken or self.released.is_set():
            return None
        p, step = self.params, self.rank.step
        how = p["persistence"]
        if how == "deterministic":
            return (p["seed"] * 1_000_003 + self.rank.rank * 7919 + input_hash(data)) & _MASK63
        if how == "intermittent":
            return self._rng.getrandbits(63) if not draw or self._draw() else None
        if (name, step) in self._once or not self._own_step(step):
            return None
        self._once.add((name, step))
        return random.Random(f"{p['seed']}/{self.entry.id}/{self.rank.rank}/{step}/{name}"
                             ).getrandbits(63)

    def _own_step(self, step: int) -> bool:
        if step in self._owned_steps:
            return True
        if self.rank.claim(f"step{step}"):
            self._owned_steps.add(step)
            return True
        return False

    def _wrong(self, name: str, flat: torch.Tensor, seed: int) -> torch.Tensor:
        """Make the chosen elements of ``flat`` wrong in place; count them; return ``flat``."""
        g = torch.Generator().manual_seed(seed)
        idx = pick(flat.numel(), self.params, g).to(flat.device)
        old = flat[idx]
        new = corrupt(old, self.params, g)
        flat[idx] = new
        changed = int((new.view(-1) != old.view(-1)).sum())
        self._note(name, int(idx.numel()), changed)
        return flat

    def _guard(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``; an ``ActionError`` (a bit outside the dtype) is this fault's
        ``fault_failed``, once, and it stops striking: never an exception in the trainer."""
        try:
            return fn(*args)
        except ActionError as e:
            if not self._broken:
                self._broken = True
                self.rank.failed(str(e))
            return None

    # --- records ------------------------------------------------------------------------------

    def _note(self, where: str, n: int, changed: int) -> None:
        p, step = self.params, self.rank.step
        with self._lock:
            rec = self._pending.get(step)
            if rec is None:
                rec = self._pending[step] = {"t": time.time(), "num_elements": 0, "changed": 0,
                                             "where": []}
            rec["num_elements"] += n
            rec["changed"] += changed
            if where not in rec["where"]:
                rec["where"].append(where)
        self.rank.struck(surface=self.surface, op=p["op"], persistence=p["persistence"],
                         lifetime=p["lifetime"], where=[where])  # the first: fault_injected

    def _flush(self) -> None:
        """One ``fault_struck`` record per step struck since the last flush."""
        p = self.params
        with self._lock:
            pending, self._pending = self._pending, {}
        for step in sorted(pending):
            rec = pending[step]
            self.rank.record(
                "fault_struck", step=step, t=rec["t"], surface=self.surface, op=p["op"],
                num_elements=rec["num_elements"], changed=rec["changed"],
                magnitude=p["magnitude"] if p["op"] in ("scale", "noise") else None,
                **({"bit_index": p["bit_index"]} if p["op"] == "bitflip" else {}),
                persistence=p["persistence"], lifetime=p["lifetime"], where=rec["where"])
