"""Thread ranks and collectives over numpy arrays: a data-parallel gradient average by hand.

    python python/examples/spawn_collectives.py
"""

import numpy as np

import tessera


def rank(c):
    rng = np.random.default_rng(c.rank)
    grad = rng.standard_normal(8).astype(np.float32)  # this rank's gradient
    mean = c.all_reduce(grad, op="mean")              # what data parallelism computes
    shard = c.reduce_scatter(np.tile(grad, c.size))   # ZeRO's piece: a sum, 8 per rank
    everyone = c.all_gather(np.array([c.rank * 10], np.int64))
    return mean, shard, everyone


results = tessera.comm.spawn(rank, world=4)
means = [m for m, _, _ in results]
assert all(np.array_equal(means[0], m) for m in means)  # every rank holds the same mean
reference = np.mean([np.random.default_rng(r).standard_normal(8).astype(np.float32)
                     for r in range(4)], axis=0)
print("mean gradient:", means[0], "max error vs numpy:", np.abs(means[0] - reference).max())
print("all_gather on rank 0:", results[0][2].ravel())

try:
    tessera.comm.spawn(lambda c: c.barrier() if c.rank else c.all_reduce(np.ones(2)), 2,
                       timeout=5)
except tessera.MismatchError as e:  # the ranks called different collectives
    print("as expected:", e)
