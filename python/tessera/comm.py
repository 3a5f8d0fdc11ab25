"""tessera.comm: thread ranks of this process with a communicator over numpy arrays.

    import numpy as np
    import tessera

    def step(c):
        x = np.full(4, c.rank, dtype=np.float32)
        return c.all_reduce(x)               # every rank: [0+1+2+3] * 4

    print(tessera.comm.spawn(step, world=4))   # one result per rank

For teaching and tests: the ranks are threads running tessera's in-process backend (the same
collectives the trainer uses); each holds the GIL while its Python code runs and releases it while
a collective waits. Errors are ``tessera.CommError`` subclasses: a rank that raises makes the
others' waits fail with ``PeerFailedError``, and ``spawn`` raises the first rank's own error.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import numpy as np

from . import _tessera

__all__ = ["Communicator", "spawn"]


class Communicator:
    """One rank's communicator inside :func:`spawn` (valid until that rank's function returns).

    Collectives take numpy arrays of float32, float64, float16, int32, int64, uint16 or uint8
    (copied to contiguous memory when they are not) and return new arrays; ``op`` is "sum",
    "mean", "max" or "min".
    """

    def __init__(self, impl: Any) -> None:
        self._c = impl

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    @property
    def name(self) -> str:
        return self._c.name

    def all_reduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        """The element-wise ``op`` of every rank's ``x`` (same shape and dtype on every rank)."""
        x = np.ascontiguousarray(x)
        out = np.empty_like(x)
        self._c.all_reduce(x, out, op)
        return out

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        """Every rank's ``x`` stacked in rank order: shape ``(size, *x.shape)``."""
        x = np.ascontiguousarray(x)
        out = np.empty((self.size,) + x.shape, dtype=x.dtype)
        self._c.all_gather(x, out)
        return out

    def reduce_scatter(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        """This rank's block of the reduction: ``x`` is split along its first axis into ``size``
        equal blocks; rank r receives the ``op`` over ranks of block r."""
        x = np.ascontiguousarray(x)
        if x.ndim == 0 or x.shape[0] % self.size:
            raise _tessera.CommUsageError(
                f"reduce_scatter: the first axis ({x.shape[0] if x.ndim else 'none'}) must split "
                f"into {self.size} equal blocks")
        out = np.empty((x.shape[0] // self.size,) + x.shape[1:], dtype=x.dtype)
        self._c.reduce_scatter(x, out, op)
        return out

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        """Rank ``root``'s ``x`` on every rank (the others pass an array of the same shape)."""
        out = np.array(x, copy=True, order="C")
        self._c.broadcast(out, root)
        return out

    def all_to_all(self, x: np.ndarray) -> np.ndarray:
        """Block j of ``x`` (first axis split into ``size`` blocks) goes to rank j, arriving as
        block r (this rank) of its result."""
        x = np.ascontiguousarray(x)
        out = np.empty_like(x)
        self._c.all_to_all(x, out)
        return out

    def send(self, x: np.ndarray, peer: int, tag: int = 0) -> None:
        """Sends ``x`` to ``peer``; returns once it has been received."""
        self._c.send(np.ascontiguousarray(x), peer, tag)

    def recv(self, peer: int, shape: Any, dtype: Any = np.float32, tag: int = 0) -> np.ndarray:
        """Receives an array of ``shape`` and ``dtype`` (as the sender's) from ``peer``."""
        out = np.empty(shape, dtype=dtype)
        self._c.recv(out, peer, tag)
        return out

    def barrier(self) -> None:
        self._c.barrier()

    def split(self, color: int, key: int = 0) -> Optional["Communicator"]:
        """The ranks with the same ``color``, ordered by ``key`` (collective); None for a
        negative color."""
        c = self._c.split(color, key)
        return None if c is None else Communicator(c)

    def __repr__(self) -> str:
        return f"<tessera.comm.Communicator {self.name!r} rank {self.rank} of {self.size}>"


def spawn(fn: Callable[[Communicator], Any], world: int = 4, *,
          timeout: Optional[float] = None) -> List[Any]:
    """Runs ``fn(communicator)`` on ``world`` thread ranks and returns their results in rank
    order.

    Args:
        fn: called once per rank with its :class:`Communicator`.
        world: the number of ranks.
        timeout: the deadline of every wait in seconds (None: ``TESSERA_COMM_TIMEOUT_S``, else
            300); a collective some rank never joins raises ``tessera.TimeoutError``.

    Raises:
        the first rank's error: its own Python exception, or a ``tessera.CommError``.
    """
    return _tessera._spawn(lambda impl: fn(Communicator(impl)), world,
                           0.0 if timeout is None else float(timeout))
