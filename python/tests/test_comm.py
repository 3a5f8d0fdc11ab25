"""tessera.comm.spawn: collectives on thread ranks against numpy references."""

import numpy as np
import pytest

import tessera
from tessera import comm

WORLDS = [1, 2, 3, 4, 7]
COUNTS = [0, 1, 7, 1000]
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


def data(rank, count, dtype):
    rng = np.random.default_rng(100 + rank)
    return (rng.standard_normal(count) * 100).astype(dtype)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_all_reduce(world, count, op):
    dtype = np.float64 if op == "sum" else np.float32
    got = comm.spawn(lambda c: c.all_reduce(data(c.rank, count, dtype), op), world)
    want = REDUCE[op](np.stack([data(r, count, dtype) for r in range(world)]), axis=0)
    for g in got:
        np.testing.assert_allclose(g, want, rtol=1e-12 if dtype == np.float64 else 0)
        assert g.dtype == dtype


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_all_reduce_integers_exactly(dtype):
    got = comm.spawn(lambda c: c.all_reduce(data(c.rank, 33, dtype)), 4)
    want = sum(data(r, 33, dtype) for r in range(4))
    for g in got:
        np.testing.assert_array_equal(g, want)


def test_mean_and_shapes_are_kept():
    got = comm.spawn(lambda c: c.all_reduce(np.full((2, 3), c.rank, np.float32), "mean"), 4)
    for g in got:
        assert g.shape == (2, 3)
        np.testing.assert_allclose(g, 1.5)


@pytest.mark.parametrize("world", WORLDS)
def test_all_gather(world):
    got = comm.spawn(lambda c: c.all_gather(data(c.rank, 5, np.float32)), world)
    want = np.stack([data(r, 5, np.float32) for r in range(world)])
    for g in got:
        np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_reduce_scatter(world):
    got = comm.spawn(lambda c: c.reduce_scatter(data(c.rank, 6 * world, np.float64)), world)
    total = sum(data(r, 6 * world, np.float64) for r in range(world))
    for r, g in enumerate(got):
        np.testing.assert_allclose(g, total[6 * r:6 * (r + 1)], rtol=1e-12)


@pytest.mark.parametrize("root", [0, 2])
def test_broadcast(root):
    got = comm.spawn(lambda c: c.broadcast(data(c.rank, 9, np.int64), root=root), 3)
    for g in got:
        np.testing.assert_array_equal(g, data(root, 9, np.int64))


def test_all_to_all():
    world = 4
    def fn(c):
        x = np.arange(world * 2, dtype=np.int32) + 100 * c.rank
        return c.all_to_all(x)
    got = comm.spawn(fn, world)
    for r, g in enumerate(got):
        want = np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * j for j in range(world)])
        np.testing.assert_array_equal(g, want)


def test_send_recv_ring():
    def fn(c):
        nxt, prev = (c.rank + 1) % c.size, (c.rank - 1) % c.size
        if c.rank % 2 == 0:
            c.send(np.full(4, c.rank, np.uint8), nxt, tag=3)
            return c.recv(prev, 4, np.uint8, tag=3)
        got = c.recv(prev, 4, np.uint8, tag=3)
        c.send(np.full(4, c.rank, np.uint8), nxt, tag=3)
        return got
    for r, g in enumerate(comm.spawn(fn, 4)):
        np.testing.assert_array_equal(g, np.full(4, (r - 1) % 4, np.uint8))


def test_split_into_groups():
    def fn(c):
        g = c.split(c.rank % 2, c.rank)
        return (g.size, g.rank, g.all_reduce(np.array([c.rank], np.int32))[0])
    assert comm.spawn(fn, 4) == [(2, 0, 2), (2, 0, 4), (2, 1, 2), (2, 1, 4)]


def test_results_and_noncontiguous_input():
    x = np.arange(12, dtype=np.float32).reshape(3, 4).T  # not C-contiguous
    got = comm.spawn(lambda c: c.all_reduce(x), 2)
    np.testing.assert_array_equal(got[0], 2 * x)


def test_a_rank_exception_is_raised_with_its_type_and_message():
    def fn(c):
        if c.rank == 1:
            raise ValueError("rank one failed")
        c.barrier()
    with pytest.raises(ValueError, match="rank one failed"):
        comm.spawn(fn, 3, timeout=30)


def test_mismatched_collectives_raise_mismatch_error():
    def fn(c):
        if c.rank == 0:
            c.all_reduce(np.zeros(2))
        else:
            c.barrier()
    with pytest.raises(tessera.MismatchError,
                       match=r"rank 0 called all_reduce #1 \(F64 x 2, sum\); rank 1 called barrier"):
        comm.spawn(fn, 2, timeout=30)


def test_a_missing_peer_times_out():
    def fn(c):
        if c.rank == 0:
            c.recv(1, 1, np.float32)  # rank 1 never sends
    with pytest.raises(tessera.CommError) as e:
        comm.spawn(fn, 2, timeout=0.5)
    assert isinstance(e.value, (tessera.TimeoutError, tessera.PeerFailedError))
    assert "recv" in str(e.value)


def test_usage_errors():
    with pytest.raises(tessera.CommUsageError, match="op 'prod'"):
        comm.spawn(lambda c: c.all_reduce(np.ones(2), "prod"), 1)
    with pytest.raises(tessera.CommUsageError, match="dtypes|float32"):
        comm.spawn(lambda c: c.all_reduce(np.ones(2, np.complex64)), 1)
    kept = comm.spawn(lambda c: c, 1)[0]
    with pytest.raises(tessera.CommUsageError, match="has returned"):
        kept.barrier()
