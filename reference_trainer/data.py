"""Deterministic synthetic tokens and the stateful global-batch sampler.

Sample ``i`` of the stream is a sequence drawn from a fixed, seeded Markov chain over the
vocabulary, generated from ``(seed, i)`` alone: any rank can produce any sample, so nothing is
downloaded and a world-size change does not change what a sample is. The chain is sparse
(each token has a few likely successors), so the loss falls visibly within a few dozen steps.

The sampler owns one number, the count of samples consumed. Step ``s`` (1-based) consumes the
global sample ids ``[(s-1)*G, s*G)`` whatever the world size; rank ``r`` of ``W`` takes the
``r``-th of ``W`` near-equal contiguous slices. Resuming restores the count, so no sample is
repeated or skipped, also when the world size changes.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["MarkovTokens", "GlobalBatchSampler"]

_SUCCESSORS = 4


class MarkovTokens:
    """Sample id → token sequence of length ``seq_len + 1`` (inputs and shifted targets)."""

    def __init__(self, *, vocab_size: int, seq_len: int, seed: int) -> None:
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.seed = seed
        rng = np.random.default_rng([seed, 0xDA7A])
        self._next = rng.integers(0, vocab_size, size=(vocab_size, _SUCCESSORS))
        probs = rng.dirichlet(np.full(_SUCCESSORS, 0.5), size=vocab_size)
        self._cdf = np.cumsum(probs, axis=1)

    def sample(self, sample_id: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1, sample_id])
        u = rng.random(self.seq_len)
        out = np.empty(self.seq_len + 1, dtype=np.int64)
        tok = int(rng.integers(0, self.vocab_size))
        out[0] = tok
        for i in range(self.seq_len):
            j = int(np.searchsorted(self._cdf[tok], u[i], side="right"))
            tok = int(self._next[tok, min(j, _SUCCESSORS - 1)])
            out[i + 1] = tok
        return out

    def batch(self, sample_ids: range) -> tuple[torch.Tensor, torch.Tensor]:
        seqs = np.stack([self.sample(i) for i in sample_ids])
        t = torch.from_numpy(seqs)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()


class GlobalBatchSampler:
    """Fixed global batch; each rank's slice of it; the position is the whole state."""

    def __init__(self, *, global_batch: int, rank: int, world_size: int) -> None:
        if world_size > global_batch:
            raise ValueError(
                f"world_size={world_size} exceeds global_batch={global_batch}: some rank would "
                f"get no samples; raise --global-batch"
            )
        self.global_batch = global_batch
        self.rank = rank
        self.world_size = world_size
        self.consumed = 0

    def global_ids(self, step: int) -> range:
        """The global sample ids that step ``step`` (1-based) consumes."""
        start = (step - 1) * self.global_batch
        return range(start, start + self.global_batch)

    def local_ids(self, step: int) -> range:
        ids = self.global_ids(step)
        base, extra = divmod(self.global_batch, self.world_size)
        lo = self.rank * base + min(self.rank, extra)
        hi = lo + base + (1 if self.rank < extra else 0)
        return ids[lo:hi]

    def advance(self, step: int) -> None:
        expected = (step - 1) * self.global_batch
        if self.consumed != expected:
            raise RuntimeError(f"sampler at {self.consumed} samples, step {step} expects "
                               f"{expected}: a sample would be repeated or skipped")
        self.consumed += self.global_batch

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed, "global_batch": self.global_batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["global_batch"] != self.global_batch:
            raise ValueError(
                f"checkpoint was written with global_batch={state['global_batch']}, this run "
                f"uses {self.global_batch}: the sample schedule would change; pass "
                f"--global-batch {state['global_batch']}"
            )
        self.consumed = int(state["consumed"])
