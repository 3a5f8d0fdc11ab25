"""tessera.train: the trainer in this process, with a per-step Python callback."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

import numpy as np

from . import _tessera

PathLike = Union[str, "os.PathLike[str]"]
StepCallback = Callable[[Dict[str, Any]], Optional[bool]]


@dataclass
class TrainResult:
    """What a run did (rank 0's view; the trainer's ``TrainResult``).

    Attributes:
        steps: the step count reached (less than ``config["steps"]`` when stopped).
        first_step: the step the run started at (> 0 when resumed).
        losses: the training loss of each step run, in order.
        last_val_loss: the last validation loss, or None without validation.
        tokens_per_s: median training throughput.
        sample: text generated at the end ("" when disabled or without a tokenizer).
        stopped_by: None when the run ended; "callback" when the callback returned False (or
            raised), else the signal's name ("SIGINT" for Ctrl-C or a notebook's interrupt).
        checkpoint: the checkpoint saved last ("" when none).
        config: every key of the configuration that ran.
    """

    steps: int
    first_step: int
    losses: List[float]
    last_val_loss: Optional[float]
    unigram_entropy: float
    tokens_per_s: float
    sample: str
    stopped_by: Optional[str]
    checkpoint: str
    memory_peaks: List[int] = field(repr=False)
    model_state_peaks: List[int] = field(repr=False)
    comm_bytes_per_step: float = field(repr=False)
    config: Dict[str, Any] = field(repr=False)


def config_keys() -> List[str]:
    """Every key a training configuration may have (``tessera train --help``'s flags, with
    ``_`` for ``-``)."""
    return list(_tessera._config_keys())


def write_tokens(path: PathLike, tokens: Iterable[Any], vocab: int) -> Path:
    """Writes token ids (one array, or an iterable of arrays of any integer dtype) as a tessera
    token file (docs/DATA.md) that ``data=`` and ``tessera train --data`` read.

    Raises:
        ConfigError: an id is not below ``vocab``.
    """
    arr = _tokens_array(tokens)
    path = Path(os.fspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    _tessera._write_token_file(str(path), arr, int(vocab))
    return path


def _tokens_array(tokens: Any) -> np.ndarray:
    if isinstance(tokens, np.ndarray):
        parts = [tokens]
    else:
        parts = [np.asarray(t) for t in tokens]
    if not parts:
        return np.zeros(0, dtype=np.uint32)
    for p in parts:
        if p.size and not np.issubdtype(p.dtype, np.integer):
            raise TypeError(f"token arrays must hold integers, not {p.dtype}")
        if p.size and p.min() < 0:
            raise ValueError("token ids must not be negative")
    return np.ascontiguousarray(np.concatenate([p.ravel() for p in parts]), dtype=np.uint32)


def _iterable_to_file(data: Iterable[Any], vocab: int, cache_dir: str) -> str:
    """Drains an iterable of token arrays into a token file in the cache directory, named by its
    content, and returns its path. The trainer then memory-maps it as it does any token file, so
    feeding from Python costs nothing per step."""
    arr = _tokens_array(data)
    digest = hashlib.sha256(arr.tobytes() + vocab.to_bytes(4, "little")).hexdigest()[:20]
    path = Path(cache_dir) / f"python-{digest}.tok"
    if not path.is_file():
        write_tokens(path, arr, vocab)
    return str(path)


def _log_to(progress: bool) -> str:
    if not progress:
        return "none"
    out, real = sys.stdout, sys.__stdout__
    try:
        # A real terminal on this process's stdout: the redrawn progress line goes straight there.
        if out is not None and out is real and real.isatty() and real.fileno() == 1:
            real.flush()
            return "terminal"
    except (AttributeError, OSError, ValueError):
        pass
    return "python"  # a notebook, a redirected or captured stream: lines every log_every steps


def train(
    config: Union[None, PathLike, Mapping[str, Any]] = None,
    *,
    data: Union[None, PathLike, Iterable[Any]] = None,
    callback: Optional[StepCallback] = None,
    progress: bool = True,
    handle_signals: bool = True,
    **keys: Any,
) -> TrainResult:
    """Trains a GPT in this process, as ``tessera train`` does, its ranks as threads.

    Args:
        config: a configuration (keys as ``tessera train --config`` files: ``{"steps": 100,
            "dp": 2, "save": "runs/x"}``; see :func:`config_keys`) or the path of such a JSON
            file; None: the defaults (a small GPT-2 on Debian's fortunes corpus).
        data: a path (as the ``data`` key), or any iterable of token-id arrays (numpy, lists):
            they are concatenated into a token file in ``cache_dir`` (ids below ``vocab``) and
            trained on as that file would be.
        callback: called after every step with the step's metrics as a dict (``step``, ``loss``,
            ``lr``, ``grad_norm``, ``tokens_per_s``, ``mfu``, ``step_ms``, ... as ``--metrics``
            writes them); returning False stops the run after that step (saving a checkpoint
            when ``save`` is set); an exception it raises stops the run the same way and is then
            re-raised.
        progress: print the progress line: redrawn in place on a terminal, otherwise (Jupyter, a
            log) a line every ``log_every`` steps, written to ``sys.stdout``.
        handle_signals: Ctrl-C (SIGINT), SIGTERM and SIGUSR1 stop the run after the current step
            and save a checkpoint when ``save`` is set (``result.stopped_by``); a second Ctrl-C
            ends the process. The previous handlers come back when the run ends.
        **keys: configuration keys that override ``config`` (``steps=10``).

    Resuming: ``resume="runs/x"`` continues the checkpoint with its saved configuration, the
    keys given overriding it, as ``tessera train --resume`` does.

    Raises:
        ConfigError, IoError, NumericError, CommError: the trainer's errors, with its messages.
    """
    if config is None:
        file: Dict[str, Any] = {}
    elif isinstance(config, Mapping):
        file = dict(config)
    else:
        with open(os.fspath(config), encoding="utf-8") as f:
            file = json.load(f)
    given = {k: (os.fspath(v) if isinstance(v, os.PathLike) else v) for k, v in keys.items()}
    if data is not None:
        if isinstance(data, (str, os.PathLike)):
            given["data"] = os.fspath(data)
        else:
            vocab = int(given.get("vocab", file.get("vocab", 512)))
            cache = str(given.get("cache_dir", file.get("cache_dir", "runs/cache")))
            given["data"] = _iterable_to_file(data, vocab, cache)
    out = _tessera._train(file, given, callback, _log_to(progress), handle_signals)
    if out["last_val_loss"] is not None and out["last_val_loss"] < 0:
        out["last_val_loss"] = None
    out.pop("rank", None)
    return TrainResult(**out)
