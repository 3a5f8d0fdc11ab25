"""tessera.schedule: ``tessera schedule`` from Python."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Union

from . import _tessera

Costs = Union[str, Sequence[float], Sequence[Sequence[float]]]


@dataclass
class Schedule:
    """A pipeline schedule, checked and simulated (``tessera schedule``'s output as values).

    Attributes:
        name: the schedule ("1f1b", "zb-h1", ...).
        ranks: every rank's actions in order, as the command prints them (``F0``, ``B0``,
            ``send F0 -> 1``, ...).
        problems: why the schedule is invalid (empty: valid).
        deadlocked, deadlock: the deadlock check and its message.
        step_time: the simulated step with the given costs.
        bubble: the idle share of the step overall; ``rank_bubbles`` per rank;
            ``bubble_formula`` the closed form ((p-1)/(m+p-1), ...) when there is one.
        peak_in_flight: per model stage, the most micro-batches whose activations it holds.
        svg: the simulated timeline drawn as SVG (a notebook displays the object as it).
    """

    name: str
    pp: int
    micro_batches: int
    virtual_stages: int
    ranks: List[List[str]]
    problems: List[str]
    deadlocked: bool
    deadlock: str
    step_time: float
    bubble: float
    rank_bubbles: List[float]
    bubble_formula: Optional[float]
    peak_in_flight: List[int]
    peak_rank_activations: List[float]
    svg: str = field(repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.deadlocked

    def _repr_svg_(self) -> str:  # Jupyter
        return self.svg

    def save_svg(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.svg)


def _costs_text(costs: Costs) -> str:
    if isinstance(costs, str):
        return costs
    items: List[Any] = list(costs)
    if items and isinstance(items[0], (list, tuple)):
        return "/".join(",".join(repr(float(x)) for x in c) for c in items)
    return ",".join(repr(float(x)) for x in items)


def schedule(kind: str = "1f1b", pp: int = 4, micro_batches: int = 8, *, virtual_stages: int = 1,
             costs: Costs = (1, 2, 1), p2p: float = 0.0) -> Schedule:
    """Builds, checks and simulates a pipeline schedule, as ``tessera schedule`` does.

    Args:
        kind: "gpipe", "1f1b", "interleaved" or "zb-h1".
        pp: pipeline ranks; micro_batches: per optimizer step; virtual_stages: model chunks per
            rank (interleaved).
        costs: (F, B, W): the forward, whole backward and weight-gradient time of one
            micro-batch through one rank's layers; or one triple per rank; or the command's
            text ("1,2,1" or "1,2,1/2,4,2/...").
        p2p: the time from a send to the earliest end of its receive.

    Raises:
        ConfigError: an unknown schedule, counts that do not fit it, or bad costs.
    """
    out = _tessera._schedule(kind, pp, micro_batches, virtual_stages, _costs_text(costs),
                             float(p2p))
    return Schedule(**out)
