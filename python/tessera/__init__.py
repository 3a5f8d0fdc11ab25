"""tessera from Python: plan, train and run GPT models on CPUs, in this process.

The functions here call tessera's C++ libraries (the module ``tessera._tessera``), the same code
the ``tessera`` command runs:

- :func:`plan` and :func:`rank_layouts`: ``tessera plan``'s memory and step-time predictions;
- :func:`train`: the trainer, its ranks as threads of this process, with a per-step callback;
- :func:`load`: a trained model, its logits, generation and weights as numpy arrays;
- :mod:`tessera.comm`: thread ranks with a communicator over numpy arrays (``comm.spawn``).

Errors are raised as :class:`tessera.Error` and its subclasses (``ConfigError``, ``IoError``,
``NumericError``, ``CommError``, ...), with the library's messages. Long work (training, plan
searches, collectives) runs with the GIL released. See docs/PYTHON.md.
"""

from ._tessera import (
    CommError,
    CommUsageError,
    ConfigError,
    Error,
    InternalError,
    IoError,
    MismatchError,
    NumericError,
    PeerFailedError,
    ShapeError,
    TimeoutError,
)
from . import comm
from ._plan import Plan, Ranking, clusters, plan, rank_layouts
from ._model import Model, load
from ._schedule import Schedule, schedule
from ._train import TrainResult, config_keys, train, write_tokens

__version__ = "0.1.0"

__all__ = [
    "CommError",
    "CommUsageError",
    "ConfigError",
    "Error",
    "InternalError",
    "Model",
    "IoError",
    "MismatchError",
    "NumericError",
    "PeerFailedError",
    "Plan",
    "Ranking",
    "Schedule",
    "ShapeError",
    "TimeoutError",
    "TrainResult",
    "clusters",
    "comm",
    "config_keys",
    "load",
    "plan",
    "rank_layouts",
    "schedule",
    "train",
    "write_tokens",
]
