"""A fault schedule is the seed's alone (chaos/steps.py): the same seed draws the same faults, holds
and gaps before the first fault is injected, and each fault's targets come from a random source of
its own, so a run slower than another, or a fault its cluster's state forbade, changes nothing
after it (seed 274, run again, ended in other faults than the run that found it)."""

from __future__ import annotations

import random

from chaos import steps
from chaos.nemesis import FAMILIES, INSTANT
from chaos.schedule import plan

FAMILY_NAMES = list(FAMILIES)
MORE = [k for f in FAMILY_NAMES for k in FAMILIES[f] if k != "add-group"]


def draw(seed: int, duration: float = 60, every_kind: bool = False) -> list[steps.Step]:
    rnd = random.Random(seed)
    return steps.draw(rnd, plan(rnd, FAMILY_NAMES, every_kind), MORE, duration, hold_s=(1.0, 6.0),
                      gap_s=(0.5, 2.0), instant=frozenset(INSTANT))


def test_a_seed_draws_the_same_schedule_every_time_and_another_seed_another():
    assert draw(274) == draw(274)
    assert draw(274) != draw(275)


def test_every_family_first_then_faults_that_fit_in_the_time():
    s = draw(274)
    first = plan(random.Random(274), FAMILY_NAMES)
    assert [x.kind for x in s[:len(first)]] == first
    assert len(s) > len(first)   # 60 s holds more than one fault of each family
    assert 2.0 + sum(x.hold_s + x.gap_s for x in s) <= 60 - 3 or len(s) == len(first)
    assert all(x.hold_s == 0 for x in s if x.kind in INSTANT)
    assert all(1.0 <= x.hold_s <= 6.0 for x in s if x.kind not in INSTANT)
    assert "add-group" not in [x.kind for x in s[len(first):]]   # one group added per schedule


def test_every_kind_draws_every_fault_even_past_the_time():
    s = draw(3, duration=10, every_kind=True)
    assert {x.kind for x in s} == {k for f in FAMILY_NAMES for k in FAMILIES[f]}


def test_a_faults_own_random_source_does_not_depend_on_what_the_faults_before_it_drew():
    untouched = [steps.for_step(274, i).random() for i in range(5)]
    busy = []
    for i in range(5):
        r = steps.for_step(274, i)
        for _ in range(i * 7):   # a fault that drew more (another cluster state, other files)
            r.random()
        busy.append(steps.for_step(274, i).random())
    assert busy == untouched
    assert steps.for_step(274, 0).random() != steps.for_step(275, 0).random()
