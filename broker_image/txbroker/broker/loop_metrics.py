"""Counters and histograms that only the broker's event loop updates, for the per-request paths.

prometheus_client guards every update with a lock and checks (a histogram also walks its buckets
in Python): a single-message transaction made 16 such updates, about 80 Python calls of the ~400
the broker spent on it (a cProfile call count, bench/README.md "Per-core speed"). Here an update
is one addition (a histogram: one bisect and two). Updates come from the loop's thread only, the
one that also renders the scrape, so no lock is needed. Scraped as ordinary families: the same
names, labels, buckets and `_total`/`_bucket`/`_sum`/`_count` samples as prometheus_client's own
(its `_created` samples are left out)."""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class LoopCounter:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class LoopHistogram:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self._bounds, amount)] += 1  # the first bound >= amount: Prometheus' `le`
        self.sum += amount


class _NeedsLabels:
    """Stands in for the unlabelled child of a family with labels: an update on the family itself
    names what is missing (as prometheus_client does), instead of an AttributeError."""

    __slots__ = ("_message",)

    def __init__(self, name: str, labelnames: tuple[str, ...]) -> None:
        self._message = f"{name} has labels {list(labelnames)}: update a child, {name}.labels(...)"

    @property
    def value(self) -> float:  # (a counter's `value += amount` reads it first)
        raise ValueError(self._message)

    def observe(self, _amount: float) -> None:
        raise ValueError(self._message)


class _Family:
    """A metric's children by label values (one unlabelled child when it has no labels)."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...], registry: CollectorRegistry):
        self._name, self._doc, self._labelnames = name, documentation, tuple(labelnames)
        self._children: dict[tuple[str, ...], object] = {}
        self._unlabelled = self.labels() if not self._labelnames else _NeedsLabels(name, self._labelnames)
        registry.register(self)

    def labels(self, *values: str):
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name}: {len(self._labelnames)} label values needed, got {values!r}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._child()
        return child

    def describe(self):
        return [self._family()]

    def collect(self):
        family = self._family()
        for values, child in self._children.items():
            self._add(family, list(values), child)
        yield family


class LoopCounterFamily(_Family):
    _child = LoopCounter

    def __init__(self, name: str, documentation: str, labelnames=(), *, registry: CollectorRegistry):
        super().__init__(name, documentation, labelnames, registry)

    def inc(self, amount: float = 1) -> None:
        self._unlabelled.value += amount

    def _family(self):
        return CounterMetricFamily(self._name, self._doc, labels=self._labelnames)

    @staticmethod
    def _add(family, values, child) -> None:
        family.add_metric(values, child.value)


class LoopHistogramFamily(_Family):
    def __init__(self, name: str, documentation: str, labelnames=(), *, buckets: tuple[float, ...],
                 registry: CollectorRegistry):
        self._bounds = tuple(float(b) for b in buckets)
        if list(self._bounds) != sorted(set(self._bounds)):
            raise ValueError(f"{name}: buckets must increase: {buckets!r}")
        super().__init__(name, documentation, labelnames, registry)

    def _child(self) -> LoopHistogram:
        return LoopHistogram(self._bounds)

    def observe(self, amount: float) -> None:
        self._unlabelled.observe(amount)

    def _family(self):
        return HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)

    def _add(self, family, values, child: LoopHistogram) -> None:
        cumulative, buckets = 0, []
        for bound, count in zip((*self._bounds, float("inf")), child.counts):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family.add_metric(values, buckets, child.sum)
