"""Which runs of a collection to merge: levels kept apart by a size ratio, merges chosen by reward.

A collection's runs form a stack, newest on top; each run is one *level* (level 0 the newest), so
a reader merges at most one run per level.  A round pushes its new run on top.  Then, while some
level holds more than ``1/ratio`` of the bytes of the level below it ("exceeds its size ratio"),
or merging it into the level below would reclaim at least ``min_reward`` bytes per byte written,
one such pair is merged into one run at the lower level — the pair with the highest *reward*,
bytes reclaimed per byte written, as the Leveled store's clerk picks the most rewarding run.
Sizes grow by at least ``ratio`` from level to level, so a collection of n bytes has at most
``log_ratio(n / smallest run) + 1`` levels, and a byte is rewritten about once per level it sinks
through (write amplification ~ levels × ratio / 2 at worst, far less when new data is small).

Bytes *reclaimed* by merging an upper run into the one below: the lower rows the upper shadows
(estimated from the runs' bottom-k id sketches) and, when the output is the bottom level, the
upper's tombstones, which are dropped there (only there: above, they still hide older rows).
Bytes *written*: both runs less what is reclaimed.  Pure Python: runs on executors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .runs import overlap, parse_sketch

DEFAULT_RATIO = 10.0
DEFAULT_MIN_REWARD = 1.0
TOMBSTONE_BYTES = 32  # what a tombstone entry costs, about (an id and a kind)


@dataclass(frozen=True, slots=True)
class Policy:
    """When levels merge: ``ratio`` between adjacent levels' bytes, and the reward (bytes
    reclaimed per byte written) at which two levels merge even within the ratio."""

    ratio: float = DEFAULT_RATIO
    min_reward: float = DEFAULT_MIN_REWARD

    def __post_init__(self) -> None:
        if self.ratio < 2:
            raise ValueError("the size ratio between levels must be at least 2")
        if self.min_reward <= 0:
            raise ValueError("min_reward must be positive")


@dataclass(frozen=True, slots=True)
class Level:
    """What the policy knows of one run: entries, bytes, tombstones, id sketch."""

    rows: int
    bytes: int
    tombstones: int = 0
    sketch: str | None = None

    def sketch_hashes(self) -> np.ndarray | None:
        """The id sketch as hashes (None when the run has none, e.g. an old-layout version)."""
        return parse_sketch(self.sketch)


@dataclass(frozen=True, slots=True)
class Merge:
    """Merge level ``upper`` into ``upper + 1``; why, and its estimated reward."""

    upper: int
    reward: float
    over_ratio: bool


def reward(upper: Level, lower: Level, *, bottom: bool) -> float:
    """Bytes reclaimed per byte written by merging ``upper`` into ``lower``."""
    shared = overlap(upper.sketch_hashes(), upper.rows, lower.sketch_hashes(), lower.rows)
    shared = min(shared, upper.rows, lower.rows)
    per_row = lower.bytes / lower.rows if lower.rows else 0.0
    reclaimed = shared * per_row
    if bottom:
        reclaimed += upper.tombstones * TOMBSTONE_BYTES
    written = max(1.0, upper.bytes + lower.bytes - reclaimed)
    return reclaimed / written


def candidates(stack: Sequence[Level], policy: Policy) -> list[Merge]:
    """Every pair of adjacent levels that should merge, best first."""
    out = []
    for i in range(len(stack) - 1):
        up, low = stack[i], stack[i + 1]
        over = up.bytes * policy.ratio > low.bytes
        r = reward(up, low, bottom=i + 1 == len(stack) - 1)
        if over or r >= policy.min_reward:
            out.append(Merge(i, r, over))
    # Highest reward first; among equals the upper level first (cascades run top down).
    out.sort(key=lambda m: (-m.reward, m.upper))
    return out


def choose(stack: Sequence[Level], policy: Policy) -> Merge | None:
    """The next merge to make, or None when every level keeps its ratio."""
    found = candidates(stack, policy)
    return found[0] if found else None
