"""What the explorer loop asks of an operation's sampler: one protocol, two searches.

- ``FixedPoints`` (grid, random): every point is registered up front; claims are whatever is
  pending; the operation is done when nothing is pending or running anywhere.
- ``OptunaSearch`` (optimize, tunebench.explore.optimize): points are proposed a few at a time and
  the search learns from each outcome.

The loop (tunebench.explore.explorer) calls only these methods, the same way for both.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from tunebench.store import PENDING, RUNNING, VALID

if TYPE_CHECKING:
    from tunebench.explore.explorer import Progress
    from tunebench.explore.space import Space
    from tunebench.store import Claim, Store

POLL_S = 0.2  # longest wait of the loop for a result (or for other explorers) before it looks again


class Search(Protocol):
    def claim(self, owner: str, capacity: int, lease_seconds: float, in_flight: Mapping[int, Claim]) -> list[Claim]:
        """Up to capacity pending requests, claimed for this explorer."""
        ...

    def tell(self, request_id: int, status: str, properties: dict[str, Any]) -> None:
        """The stored outcome of a request this explorer ran (status "lost": another explorer took it)."""
        ...

    def done(self) -> bool:
        """Nothing in flight here: True when the operation is finished, else False (after a short wait
        when only other explorers' work is left)."""
        ...

    def count(self, progress: Progress) -> None:
        """Set progress.done (and the search's own counts) from what the search knows."""
        ...

    def best(self) -> dict[str, Any] | None:
        """The best valid point so far: {experiment, entity values, metric: value}."""
        ...


class FixedPoints:
    """Grid and random operations: the points are in the store; the store says what is left."""

    def __init__(self, space: Space, store: Store) -> None:
        self.space, self.store, self.operation_id = space, store, space.operation_id

    def claim(self, owner: str, capacity: int, lease_seconds: float, in_flight: Mapping[int, Claim]) -> list[Claim]:
        return self.store.claim(self.operation_id, owner, capacity, lease_seconds)

    def tell(self, request_id: int, status: str, properties: dict[str, Any]) -> None:
        return None  # the store holds the outcome; nothing is learnt

    def done(self) -> bool:
        counts = self.store.counts(self.operation_id)
        if not counts.get(PENDING, 0) and not counts.get(RUNNING, 0):
            return True
        # pending requests were claimed by someone else meanwhile, or other explorers hold claims: wait for
        # their results or for their leases to expire (requeued by the loop)
        time.sleep(POLL_S if counts.get(RUNNING, 0) else 0.05)
        return False

    def count(self, progress: Progress) -> None:
        progress.done = progress.valid + progress.invalid + progress.failed

    def best(self) -> dict[str, Any] | None:
        metric, maximize = self.space.operation.metric, self.space.operation.direction == "maximize"
        best = None
        for row in self.store.rows(operation_id=self.operation_id, statuses=[VALID]):
            value = (row["properties"] or {}).get(metric)
            if not isinstance(value, (int, float)):
                continue
            if best is None or (value > best[metric] if maximize else value < best[metric]):
                best = {"experiment": row["experiment_id"], "entity": row["entity"], metric: value}
        return best
