"""Scraping a broker's Prometheus endpoint in a test: ``scrape(cluster.metrics_url(0))``.

The text is parsed by prometheus_client's own parser (the format Prometheus
reads), into samples a test can look up by metric name and labels::

    m = scrape(cluster.metrics_url(0))
    m.value("kafka_server_replicamanager_leadercount")
    m.value("kafka_consumergroup_lag", consumergroup="g", topic="t", partition="0")
    m.total("kafka_server_replicamanager_underreplicatedpartitions")  # summed over matching series
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Scrape", "scrape"]


@dataclass(frozen=True)
class Scrape:
    """Every sample of one scrape: (sample name, labels, value)."""

    samples: tuple[tuple[str, dict[str, str], float], ...]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        return cls(
            tuple(
                (s.name, dict(s.labels), float(s.value))
                for family in text_string_to_metric_families(text)
                for s in family.samples
            )
        )

    def names(self) -> set[str]:
        return {name for name, _labels, _value in self.samples}

    def series(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        """The samples named ``name`` whose labels include ``labels``."""
        return [
            (sl, v)
            for n, sl, v in self.samples
            if n == name and all(sl.get(k) == str(want) for k, want in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the one sample named ``name`` with exactly ``labels``; None if there is none."""
        for n, sl, v in self.samples:
            if n == name and sl == {k: str(want) for k, want in labels.items()}:
                return v
        return None

    def total(self, name: str, **labels: str) -> float:
        """The sum over the samples named ``name`` whose labels include ``labels`` (0 if none)."""
        return sum(v for _sl, v in self.series(name, **labels))


def scrape(url: str, timeout: float = 10.0) -> Scrape:
    """GET ``url`` (a broker's ``/metrics``) and parse it; raises OSError if it cannot be reached."""
    # Loopback in tests: no proxy may route the request elsewhere.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as resp:
        return Scrape.parse(resp.read().decode())
