"""tessera.plan and tessera.rank_layouts: ``tessera plan`` from Python."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

from . import _tessera

_CLUSTERS = Path(__file__).parent / "clusters"

PathLike = Union[str, "os.PathLike[str]"]


def clusters() -> List[str]:
    """The names of the shipped cluster descriptions (``dev-vm``, ``dgx-a100-80gb``, ...)."""
    names = {p.stem for p in _CLUSTERS.glob("*.json")}
    names.update(_tessera._cluster_names())
    return sorted(names)


def _cluster(cluster: PathLike) -> str:
    """A shipped name as the file this package carries; a path or another name unchanged."""
    text = os.fspath(cluster)
    shipped = _CLUSTERS / f"{text}.json"
    if os.sep not in text and not text.endswith(".json") and shipped.is_file():
        return str(shipped)
    return text


def _json(value: Union[None, PathLike, Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """A dictionary, or the JSON file at a path, or None."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return dict(value)
    import json

    with open(os.fspath(value), encoding="utf-8") as f:
        return json.load(f)


def _request(model, config, cluster, batch, engine, precision, link, dp_overlap, oversubscribe,
             bucket_mb, optimizer, moe_skew, devices) -> Dict[str, Any]:
    return {
        "model": _json(model),
        "model_source": os.fspath(model) if isinstance(model, (str, os.PathLike)) else "model",
        "config": _json(config),
        "cluster": _cluster(cluster),
        "batch": batch,
        "engine": engine,
        "precision": precision,
        "link": link,
        "dp_overlap": dp_overlap,
        "oversubscribe": oversubscribe,
        "bucket_mb": bucket_mb,
        "optimizer": optimizer,
        "moe_skew": moe_skew,
        "devices": devices,
    }


@dataclass
class Plan:
    """One layout's prediction, as ``tessera plan --json`` writes it.

    ``request`` and ``prediction`` are the two objects of the command's JSON (``to_json()`` gives
    that object back); the attributes below are the prediction's headline numbers.
    """

    request: Dict[str, Any]
    prediction: Dict[str, Any]
    text: str = field(repr=False)

    @property
    def ok(self) -> bool:
        """Whether the layout can run at all (no ``problems``)."""
        return not self.prediction.get("problems")

    @property
    def fits(self) -> bool:
        """Whether every rank's memory fits the device."""
        return bool(self.prediction.get("fits"))

    @property
    def memory(self) -> Dict[str, Any]:
        """The largest rank's memory per device, by term (bytes)."""
        return self.prediction.get("memory", {})

    @property
    def step_seconds(self) -> float:
        return float(self.prediction.get("step_seconds", 0.0))

    @property
    def tokens_per_second(self) -> float:
        return float(self.prediction.get("tokens_per_second", 0.0))

    @property
    def mfu(self) -> float:
        return float(self.prediction.get("mfu", 0.0))

    def to_json(self) -> Dict[str, Any]:
        """The object ``tessera plan --json`` writes: ``{"request": ..., "prediction": ...}``."""
        return {"request": self.request, "prediction": self.prediction}

    def __str__(self) -> str:
        return self.text


@dataclass
class Ranking:
    """Every layout of a device count, as ``tessera plan --json`` writes a ranking.

    ``data`` is the command's JSON object; ``fitting`` lists the layouts that fit, fastest
    first, and ``not_fitting`` the others, smallest need first.
    """

    data: Dict[str, Any]
    text: str = field(repr=False)

    @property
    def fitting(self) -> List[Dict[str, Any]]:
        return self.data.get("fitting", [])

    @property
    def not_fitting(self) -> List[Dict[str, Any]]:
        return self.data.get("not_fitting", [])

    @property
    def best(self) -> Optional[Dict[str, Any]]:
        """The fastest layout that fits, or None."""
        return self.fitting[0] if self.fitting else None

    def to_json(self) -> Dict[str, Any]:
        return self.data

    def __str__(self) -> str:
        return self.text


def plan(
    model: Union[None, PathLike, Mapping[str, Any]] = None,
    cluster: PathLike = "dev-vm",
    layout: Optional[Mapping[str, Any]] = None,
    *,
    config: Union[None, PathLike, Mapping[str, Any]] = None,
    batch: Optional[int] = None,
    engine: str = "",
    precision: str = "",
    link: str = "inproc",
    dp_overlap: Optional[float] = None,
    oversubscribe: bool = False,
    bucket_mb: Optional[float] = None,
    optimizer: Optional[str] = None,
    moe_skew: Optional[float] = None,
    devices: Optional[int] = None,
) -> Plan:
    """Predict one layout's memory per device, step time, tokens/s and MFU (``tessera plan``).

    Args:
        model: a model description (``{"layers": 96, "hidden": 12288, "heads": 96, "seq": 2048,
            "vocab": 50257}``), a Hugging Face ``config.json``, or a path to either; None: the
            command's default model (4 layers of 192, 4 heads, seq 128, vocab 512).
        cluster: a shipped cluster name (:func:`clusters`) or a cluster JSON file.
        layout: keys as ``tessera train``'s flags: dp, tp, pp, ep, cp, cp_comm, zero, sp,
            schedule, virtual_stages, micro_batch (0: batch / dp), recompute.
        config: a ``tessera train`` configuration (a dict or a JSON file), as ``--config``: its
            model, layout, batch and engine options, under the arguments given.
        batch: the global batch in sequences (None: the config's, else 16). The other keywords
            are the command's flags of the same names (``engine`` and ``precision`` "" = the
            cluster's; None = the config's or the default: ``bucket_mb`` 25, ``optimizer``
            "adamw", ``moe_skew`` 1).

    Returns:
        a :class:`Plan` whose ``to_json()`` equals ``tessera plan ... --json -``'s output.

    Raises:
        ConfigError: the model, layout or cluster is unusable (the message says why).
    """
    r = _request(model, config, cluster, batch, engine, precision, link, dp_overlap,
                 oversubscribe, bucket_mb, optimizer, moe_skew, devices)
    out = _tessera._plan(r, dict(layout or {}))
    return Plan(request=out["request"], prediction=out["prediction"], text=out["text"])


def rank_layouts(
    model: Union[None, PathLike, Mapping[str, Any]] = None,
    cluster: PathLike = "dev-vm",
    *,
    devices: Optional[int] = None,
    fixed: Optional[Mapping[str, Any]] = None,
    max_cp: int = 1,
    config: Union[None, PathLike, Mapping[str, Any]] = None,
    batch: Optional[int] = None,
    engine: str = "",
    precision: str = "",
    link: str = "inproc",
    dp_overlap: Optional[float] = None,
    oversubscribe: bool = False,
    bucket_mb: Optional[float] = None,
    optimizer: Optional[str] = None,
    moe_skew: Optional[float] = None,
    top: int = 20,
    simulate_top: int = 32,
) -> Ranking:
    """Rank every layout of ``devices`` devices (default: the cluster's), as ``tessera plan``
    does without ``--dp/--tp/--pp``.

    Args:
        fixed: layout keys held fixed (``{"tp": 8, "zero": 1}``); the others are enumerated.
        max_cp: also try context parallelism up to this (1: none).
        top: layouts described in full in the result (the command's ``--top``).
        simulate_top: the fastest estimated layouts re-timed with the schedule simulator.
        config: as :func:`plan`'s: its model, batch and engine options (and its cp, held).
        The other arguments are :func:`plan`'s.

    Returns:
        a :class:`Ranking` whose ``to_json()`` equals the command's ``--json`` output.
    """
    r = _request(model, config, cluster, batch, engine, precision, link, dp_overlap,
                 oversubscribe, bucket_mb, optimizer, moe_skew, devices)
    out = _tessera._rank_layouts(r, dict(fixed or {}), max_cp, simulate_top, top)
    text = out.pop("text")
    return Ranking(data=out, text=text)
