"""A schedule's faults from its seed alone, drawn before the first is injected: which, in what order,
each held how long and how far from the next; and a random source of its own per fault for its
targets and details (`for_step`).

So a seed replays its faults whatever the timing of the run. Drawn as the run went, a slower run
fitted fewer faults into its time, and a fault the cluster's state forbade at its turn (a group
still re-seeding, a drain under way) was replaced by another draw: past the first difference every
later fault was another (seed 274's last four faults, run again, were one other fault). Now a fault
the state forbids waits for it, or is skipped and reported so, and the ones after it are as drawn.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Step:
    kind: str
    hold_s: float  # from injecting the fault to healing it (0: it holds no time)
    gap_s: float   # from healing it to the next


def draw(rnd: random.Random, first: list[str], more: list[str], duration_s: float, *,
         hold_s: tuple[float, float], gap_s: tuple[float, float], instant: frozenset[str] = frozenset(),
         start_s: float = 2.0) -> list[Step]:
    """Every fault of `first`, in its order, then faults drawn from `more` while their planned times
    fit in `duration_s` (3 s left over at the end)."""
    def step(kind: str) -> Step:
        hold = 0.0 if kind in instant else round(rnd.uniform(*hold_s), 2)
        return Step(kind, hold, round(rnd.uniform(*gap_s), 2))

    steps = [step(kind) for kind in first]
    t = start_s + sum(s.hold_s + s.gap_s for s in steps)
    while more:
        s = step(rnd.choice(more))
        if t + s.hold_s + s.gap_s > duration_s - 3:
            return steps
        steps.append(s)
        t += s.hold_s + s.gap_s
    return steps


def for_step(seed: int, index: int) -> random.Random:
    """The random source of a schedule's fault `index`: its seed and its place alone."""
    return random.Random(f"{seed}/{index}")


def as_report(steps: list[Step]) -> list[dict]:
    return [asdict(s) for s in steps]
