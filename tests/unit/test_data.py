"""reference_trainer.data: the global-batch sampler and the synthetic Markov token source."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainer.data import _SUCCESSORS, GlobalBatchSampler, MarkovTokens

# --- GlobalBatchSampler ----------------------------------------------------------------------


def _samplers(global_batch: int, world_size: int) -> list[GlobalBatchSampler]:
    return [GlobalBatchSampler(global_batch=global_batch, rank=r, world_size=world_size)
            for r in range(world_size)]


@settings(max_examples=100, deadline=None)
@given(world_size=st.integers(1, 5), extra=st.integers(0, 40), step=st.integers(1, 10**6))
def test_rank_slices_partition_the_step(world_size: int, extra: int, step: int) -> None:
    global_batch = world_size + extra  # every rank gets at least one sample
    samplers = _samplers(global_batch, world_size)
    global_ids = samplers[0].global_ids(step)
    assert list(global_ids) == list(range((step - 1) * global_batch, step * global_batch))
    slices = [list(s.local_ids(step)) for s in samplers]
    assert all(s.global_ids(step) == global_ids for s in samplers)
    # Disjoint, and their union is exactly the step's global ids; in rank order, contiguous.
    assert sorted(i for sl in slices for i in sl) == list(global_ids)
    assert [i for sl in slices for i in sl] == list(global_ids)
    # Near-equal: sizes differ by at most one, and nobody is left without samples.
    sizes = [len(sl) for sl in slices]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_global_batch_12_at_every_world_size(world_size: int) -> None:
    for step in (1, 2, 7):
        slices = [set(s.local_ids(step)) for s in _samplers(12, world_size)]
        for a in range(world_size):
            for b in range(a + 1, world_size):
                assert not slices[a] & slices[b]
        assert set().union(*slices) == set(range((step - 1) * 12, step * 12))


def test_more_ranks_than_samples_is_refused() -> None:
    with pytest.raises(ValueError, match="--global-batch"):
        GlobalBatchSampler(global_batch=3, rank=0, world_size=4)


def _train(samplers: list[GlobalBatchSampler], steps: int, seen: Counter[int]) -> None:
    """What the trainer does on every rank: the next step comes from the sampler position."""
    for _ in range(steps):
        step = samplers[0].consumed // samplers[0].global_batch + 1
        for s in samplers:
            seen.update(s.local_ids(step))
            s.advance(step)
    assert len({s.consumed for s in samplers}) == 1


@settings(max_examples=100, deadline=None)
@given(global_batch=st.integers(5, 24), w1=st.integers(1, 5), w2=st.integers(1, 5),
       data=st.data())
def test_world_size_change_consumes_every_sample_exactly_once(
        global_batch: int, w1: int, w2: int, data: st.DataObject) -> None:
    total = data.draw(st.integers(1, 12), label="total steps")
    k = data.draw(st.integers(0, total), label="steps before the world-size change")
    seen: Counter[int] = Counter()
    before = _samplers(global_batch, w1)
    _train(before, k, seen)
    state = before[0].state_dict()
    assert state == {"consumed": k * global_batch, "global_batch": global_batch}
    after = _samplers(global_batch, w2)
    for s in after:
        s.load_state_dict(dict(state))
    _train(after, total - k, seen)
    assert sorted(seen) == list(range(total * global_batch))
    assert set(seen.values()) <= {1}


def test_advance_with_the_wrong_step_raises() -> None:
    s = GlobalBatchSampler(global_batch=12, rank=0, world_size=1)
    with pytest.raises(RuntimeError, match="step 2"):
        s.advance(2)  # step 1 not done yet: step 2 would skip samples
    s.advance(1)
    with pytest.raises(RuntimeError, match="repeated or skipped"):
        s.advance(1)  # would repeat step 1
    assert s.consumed == 12  # failed calls change nothing
    s.advance(2)
    assert s.consumed == 24


def test_load_state_dict_restores_the_position() -> None:
    a = GlobalBatchSampler(global_batch=12, rank=0, world_size=3)
    for step in (1, 2, 3):
        a.advance(step)
    b = GlobalBatchSampler(global_batch=12, rank=1, world_size=2)
    b.load_state_dict(a.state_dict())
    with pytest.raises(RuntimeError):
        b.advance(3)
    b.advance(4)
    assert b.consumed == 48


def test_load_state_dict_with_another_global_batch_names_the_flag() -> None:
    a = GlobalBatchSampler(global_batch=12, rank=0, world_size=1)
    a.advance(1)
    b = GlobalBatchSampler(global_batch=16, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"--global-batch 12\b"):
        b.load_state_dict(a.state_dict())
    assert b.consumed == 0


# --- MarkovTokens ----------------------------------------------------------------------------


def test_same_seed_and_id_give_the_same_sample() -> None:
    a = MarkovTokens(vocab_size=512, seq_len=64, seed=3)
    b = MarkovTokens(vocab_size=512, seq_len=64, seed=3)
    for i in (0, 1, 17, 10**9):
        assert np.array_equal(a.sample(i), b.sample(i))
    # Order of generation does not matter: a sample depends on (seed, id) alone.
    assert np.array_equal(b.sample(5), a.sample(5))


def test_different_seeds_or_ids_give_different_samples() -> None:
    a = MarkovTokens(vocab_size=512, seq_len=64, seed=0)
    b = MarkovTokens(vocab_size=512, seq_len=64, seed=1)
    for i in range(5):
        assert not np.array_equal(a.sample(i), b.sample(i))
    assert len({a.sample(i).tobytes() for i in range(20)}) == 20


@settings(max_examples=50, deadline=None)
@given(vocab=st.integers(1, 300), seq_len=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       sample_id=st.integers(0, 2**40))
def test_tokens_are_within_the_vocabulary(vocab: int, seq_len: int, seed: int,
                                          sample_id: int) -> None:
    s = MarkovTokens(vocab_size=vocab, seq_len=seq_len, seed=seed).sample(sample_id)
    assert s.shape == (seq_len + 1,)
    assert s.dtype == np.int64
    assert s.min() >= 0 and s.max() < vocab


def test_batch_shapes_and_shifted_targets() -> None:
    data = MarkovTokens(vocab_size=64, seq_len=16, seed=0)
    ids = range(24, 30)
    x, y = data.batch(ids)
    assert x.shape == y.shape == (6, 16)
    assert x.dtype == y.dtype == torch.int64
    assert x.is_contiguous() and y.is_contiguous()
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    for row, i in enumerate(ids):
        full = torch.from_numpy(data.sample(i))
        assert torch.equal(x[row], full[:-1]) and torch.equal(y[row], full[1:])


def test_the_chain_is_sparse() -> None:
    """Each token has only a few successors: what makes the loss fall within a few steps."""
    vocab = 50
    data = MarkovTokens(vocab_size=vocab, seq_len=200, seed=7)
    successors: dict[int, set[int]] = defaultdict(set)
    for i in range(20):
        s = data.sample(i)
        for a, b in zip(s[:-1], s[1:], strict=True):
            successors[int(a)].add(int(b))
    assert len(successors) > vocab // 2  # the walk visits much of the vocabulary
    assert max(len(v) for v in successors.values()) <= _SUCCESSORS < vocab
