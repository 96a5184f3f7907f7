"""Job Sequencing with Deadlines: which predicted experts to copy, and in which order.

Time on the copy link is cut into slots of one expert's transfer time. Every predicted
expert that is neither resident nor on its way is a job that takes one slot, must end
before its layer starts (its deadline, counted in slots from now) and is worth its
profit (the predicted probability times the stall a hit saves). Greedy JSD takes jobs by
decreasing profit and puts each in the latest free slot before its deadline, found with
a union-find over slots; with unit-length jobs this maximises the total profit, also
under a cap on how many copies the cache has room for (a truncated matroid).

A job that finds no free slot before its deadline is *dropped*, not demoted to a later
slot: a copy that lands after its layer has run is a miss anyway and would only occupy
the link and a slot that the next re-plan (one layer later) can use better.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .transfer import ExpertKey


@dataclass(frozen=True)
class Job:
    key: ExpertKey
    deadline: int
    """Slots that end before the expert's layer starts (0: too late to prefetch)."""
    profit: float


def schedule(jobs: Sequence[Job], capacity: int) -> list[Job]:
    """The most profitable feasible set of at most ``capacity`` jobs, in slot (execution) order."""
    horizon = max(0, min(max((job.deadline for job in jobs), default=0), len(jobs)))
    parent = list(range(horizon + 1))  # parent[t]: latest free slot <= t, as slot index + 1 (0 = none)

    def latest_free(t: int) -> int:
        root = t
        while parent[root] != root:
            root = parent[root]
        while parent[t] != root:
            parent[t], t = root, parent[t]
        return root

    placed: dict[int, Job] = {}
    for job in sorted(jobs, key=lambda j: (-j.profit, j.deadline, j.key)):
        if len(placed) >= capacity:
            break
        slot = latest_free(max(0, min(job.deadline, horizon)))
        if slot == 0:
            continue
        placed[slot] = job
        parent[slot] = slot - 1
    return [placed[slot] for slot in sorted(placed)]
