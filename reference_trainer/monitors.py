"""The bar's silent-failure monitors: a cross-replica fingerprint and a loss/grad-norm spike check.

Both only read: the parameters (hashed, never written), the step's losses and its gradient norm.
Both ride the step's one stats all-reduce (train.py): each rank writes its values into slots of
its own, zeros elsewhere, so the sum every rank gets back is an all-gather of them. No new
collective, so a collective fault counts the same ops and steps with or without them, and no
value of the existing slots changes (a sum with zeros is exact).

- :class:`ReplicaFingerprint`: with ``--replicate N`` (HSDP: a (replicate, shard) mesh) the ranks
  that hold the same shard hold bitwise the same parameters after every optimizer step. Each rank
  hashes its local shard; a rank whose hash differs from its replicas' has diverged (a corrupted
  update or weights). Three or more replicas name the odd one out by majority; two can only say
  that they disagree. Without replicas there is nothing to compare: said once at start.
- :class:`SpikeCheck`: a loss (global or a rank's own) or a gradient norm more than ``factor``
  times the median of the last ``window`` steps. A rank's own loss names it; the global gradient
  norm names nobody (FSDP reduces every rank's gradient into every shard).

A finding is an ``anomaly`` record (``what: sdc_suspected`` / ``loss_spike`` /
``grad_norm_spike``), written by rank 0 (every rank sees the same sums), once per episode.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, deque
from collections.abc import Iterable

import torch

__all__ = ["BarMonitors", "ReplicaFingerprint", "SpikeCheck", "SpikeMonitor", "shard_fingerprint"]


def shard_fingerprint(params: Iterable[torch.Tensor]) -> float:
    """A 48-bit hash of the bytes of these tensors (a DTensor's local shard), plus 1, as a
    float64: exact in a float64 sum with zeros, and never 0 (0 is "no value")."""
    h = hashlib.blake2b(digest_size=6)
    for p in params:
        local = p.to_local() if hasattr(p, "to_local") else p
        t = local.detach().contiguous().cpu()
        h.update(t.view(torch.uint8).numpy().tobytes())
    return float(int.from_bytes(h.digest(), "little") + 1)


class ReplicaFingerprint:
    """Compares each rank's shard fingerprint with those of the ranks holding the same shard.

    Ranks are laid out as ``init_device_mesh`` lays a (replicate, shard) mesh: rank
    ``r * shards + j`` holds shard ``j`` of replica ``r``.
    """

    def __init__(self, world_size: int, replicate: int) -> None:
        self.world_size, self.replicate = world_size, replicate
        self.shards = world_size // replicate
        self._reported: frozenset[int] = frozenset()

    @property
    def active(self) -> bool:
        return self.replicate > 1

    def describe(self) -> str:
        if not self.active:
            return ("fingerprint: nothing to compare: no replicas (fully sharded; --replicate N "
                    "for HSDP replicas)")
        attribution = "majority attribution" if self.replicate >= 3 else "detection only"
        return (f"fingerprint: {self.replicate} replicas of {self.shards} shard(s), "
                f"{attribution}")

    def slot_width(self) -> int:
        return self.world_size if self.active else 0

    def fill(self, slots: torch.Tensor, rank: int, params: Iterable[torch.Tensor]) -> None:
        if self.active:
            slots[rank] = shard_fingerprint(params)

    def check(self, step: int, prints: list[float]) -> dict[str, object] | None:
        """One step's fingerprints (every rank's, in rank order); the anomaly's fields when a
        new disagreement is found."""
        if not self.active or len(prints) != self.world_size:
            return None
        suspects: set[int] = set()
        disagreeing: set[int] = set()
        for j in range(self.shards):
            group = [r * self.shards + j for r in range(self.replicate)]
            values = [prints[r] for r in group]
            if len(set(values)) == 1:
                continue
            disagreeing.update(group)
            value, count = Counter(values).most_common(1)[0]
            if count * 2 > len(values):  # a strict majority agrees: the others are odd
                suspects.update(r for r in group if prints[r] != value)
        key = frozenset(suspects or disagreeing)
        if not disagreeing or key == self._reported:
            if not disagreeing:
                self._reported = frozenset()
            return None
        self._reported = key
        fields: dict[str, object] = {"what": "sdc_suspected", "step": step,
                                     "monitor": "fingerprint", "replicas": self.replicate,
                                     "disagreeing_ranks": sorted(disagreeing)}
        if suspects:
            fields["ranks"] = sorted(suspects)
            if len(suspects) == 1:
                fields["suspect_rank"] = next(iter(suspects))
        else:
            fields["attributed"] = False  # two replicas, or no majority: detected only
        return fields


class SpikeCheck:
    """A value far above its own recent median: ``factor`` times the median of the last
    ``window`` finite values, once at least ``min_history`` are known. Non-finite values are
    the non-finite check's (train.py) and are neither judged nor kept. A spike is not kept in
    the history either, so that a run of them stays measured against the normal steps."""

    def __init__(self, *, factor: float, window: int = 10, min_history: int = 5) -> None:
        self.factor, self.min_history = factor, min_history
        self._history: deque[float] = deque(maxlen=window)

    def median(self) -> float | None:
        if len(self._history) < self.min_history:
            return None
        ordered = sorted(self._history)
        return ordered[len(ordered) // 2]

    def update(self, value: float) -> float | None:
        """Feed one value; returns the median it spiked over, or None."""
        if self.factor <= 0 or not math.isfinite(value):
            return None
        base = self.median()
        if base is not None and value > self.factor * base:
            return base
        self._history.append(value)
        return None


class SpikeMonitor:
    """The loss and grad-norm spike checks of one job: the global loss, each rank's own loss
    (per token, from its slot of the stats) and the global gradient norm. Each reports once per
    episode of consecutive spiking steps."""

    def __init__(self, world_size: int, *, factor: float) -> None:
        self.world_size, self.factor = world_size, factor
        self._loss = SpikeCheck(factor=factor)
        self._rank_loss = [SpikeCheck(factor=factor) for _ in range(world_size)]
        self._grad = SpikeCheck(factor=factor)
        self._in_episode = {"loss_spike": False, "grad_norm_spike": False}

    def slot_width(self) -> int:
        return self.world_size if self.factor > 0 else 0

    def check(self, step: int, loss: float, rank_losses: list[float],
              grad_norm: float) -> list[dict[str, object]]:
        """The anomalies' fields of this step's new spikes (none most steps)."""
        if self.factor <= 0:
            return []
        found: dict[str, dict[str, object]] = {}
        base = self._loss.update(loss)
        spiked = [r for r, (check, v) in enumerate(zip(self._rank_loss, rank_losses, strict=True))
                  if check.update(v) is not None]
        if base is not None or spiked:
            fields: dict[str, object] = {"loss": loss, "median": base}
            if spiked:  # a rank's own loss spiked: it names that rank
                fields.update(ranks=spiked, rank_losses=[round(v, 6) for v in rank_losses])
            found["loss_spike"] = fields
        base = self._grad.update(grad_norm)
        if base is not None:  # the global norm: every rank's gradient is in every shard
            found["grad_norm_spike"] = {"grad_norm": grad_norm, "median": base}
        out = [{"what": what, "step": step, "monitor": "spike", "factor": self.factor, **fields}
               for what, fields in found.items() if not self._in_episode[what]]
        self._in_episode = {what: what in found for what in self._in_episode}
        return out


class BarMonitors:
    """Both monitors and their slots, which the caller appends to the step's stats vector:
    ``width`` float64s, the fingerprints first (one per rank, with replicas), then each rank's
    own loss per token (one per rank, unless the spike check is off)."""

    def __init__(self, world_size: int, rank: int, *, replicate: int,
                 spike_factor: float) -> None:
        self.rank = rank
        self.fingerprint = ReplicaFingerprint(world_size, replicate)
        self.spikes = SpikeMonitor(world_size, factor=spike_factor)
        self._fw = self.fingerprint.slot_width()
        self.width = self._fw + self.spikes.slot_width()

    def describe(self) -> dict[str, str]:
        spike = (f"spike: loss and grad norm over {self.spikes.factor}x the median of the last "
                 f"10 steps" if self.spikes.factor > 0 else "spike: off")
        return {"fingerprint": self.fingerprint.describe(), "spike": spike}

    def fill(self, slots: torch.Tensor, params: Iterable[torch.Tensor],
             local_loss: float) -> None:
        """Write this rank's values into its slots (``slots`` is the tail of the stats)."""
        self.fingerprint.fill(slots[:self._fw], self.rank, params)
        if self.spikes.slot_width():
            slots[self._fw + self.rank] = local_loss

    def check(self, step: int, slots: list[float], *, loss: float,
              grad_norm: float) -> list[dict[str, object]]:
        """The summed slots of the step (every rank's values): the anomalies' fields found."""
        found = self.fingerprint.check(step, slots[:self._fw])
        out = [found] if found else []
        if self.spikes.slot_width():
            out += self.spikes.check(step, loss, slots[self._fw:], grad_norm)
        return out


def finding_line(fields: dict[str, object]) -> str:
    """One line for the log, for a reader and for a ``log_pattern``."""
    what, step = fields["what"], fields["step"]
    if what == "sdc_suspected":
        named = fields.get("ranks")
        if isinstance(named, list) and named:
            return "; ".join(f"SDC: fingerprint of rank {r} disagrees at step {step}"
                             for r in named)
        return (f"SDC: fingerprints of ranks {fields['disagreeing_ranks']} disagree at step "
                f"{step} (no majority to name one)")
    who = f" on ranks {fields['ranks']}" if fields.get("ranks") else ""
    return f"{str(what).replace('_', ' ')} at step {step}{who} (median {fields['median']})"
