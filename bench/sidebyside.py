"""Side-by-side figures of two systems: medians, ratios, CPU per GB, the table and the chart.

Pure functions over :class:`Measured` runs (one benchmark run of one system, with the broker CPU
it cost and the verdict on the machine's load), so the arithmetic is tested without running
anything. The rules:

* each benchmark has one headline figure: records/s for the 100-byte produce, p99 ms for latency
  (lower is better), MB/s (10^6 bytes) for the rest; of the repeats the median run by that figure
  is reported (of an even number, the lower middle), as ``run_all.py`` does;
* ``Sluice/Kafka`` is Sluice's figure over Kafka's, so above 1 is Sluice ahead for throughput; for
  latency it is written "N.NNx slower" or "N.NNx faster", never a bare number whose direction the
  reader must guess;
* broker CPU per GB is the sum of the broker processes' CPU seconds over the sum of bytes moved,
  over every run of the benchmarks that produce (or the one that consumes), not a median of
  ratios: the total is what a GB costs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRODUCING = ("produce-1KiB-acks-all", "produce-100B-acks-all", "transactions-1KiB-100ms")
CONSUMING = ("consume-read_committed-1KiB",)


@dataclass
class Measured:
    system: str  # "sluice" or "kafka"
    name: str
    kind: str  # produce, transactions, consume, latency
    records: int
    bytes: int
    seconds: float
    mb_per_s: float
    records_per_s: float
    latency_ms: dict[str, float] | None = None
    broker_cpu_s: float = 0.0  # broker process trees, during the timed part
    load_1m: float = 0.0  # at the end of the run
    foreign_share: float = 0.0  # CPU share other processes took meanwhile (bench.verdict)
    valid: bool = True
    reasons: list[str] = field(default_factory=list)
    error: str = ""
    run: str = ""

    @classmethod
    def from_result(cls, system: str, r: Any, **extra: Any) -> Measured:
        """From a ``sluice.cli.engines.bench.BenchResult`` (either system's)."""
        return cls(system=system, name=r.name, kind=r.kind, records=r.records, bytes=r.bytes, seconds=r.seconds,
                   mb_per_s=r.mb_per_s, records_per_s=r.records_per_s, latency_ms=r.latency_ms, error=r.error,
                   **extra)  # fmt: skip


def figure_of(m: Measured) -> tuple[str, float, bool]:
    """(label, value, higher_is_better) of a run's headline figure."""
    if m.kind == "latency":
        return "p99 ms", (m.latency_ms or {}).get("p99", 0.0), False
    if "100B" in m.name:
        return "records/s", m.records_per_s, True
    return "MB/s", m.mb_per_s, True


def median_run(runs: Sequence[Measured]) -> Measured:
    """The run with the median headline figure (failed runs rank last)."""
    if not runs:
        raise ValueError("no runs")

    def goodness(m: Measured) -> float:
        _, v, higher = figure_of(m)
        if m.error:
            return float("-inf")
        return v if higher else -v

    ranked = sorted(runs, key=goodness, reverse=True)
    return ranked[(len(ranked) - 1) // 2]


def cpu_per_gb(runs: Iterable[Measured], names: Sequence[str]) -> float | None:
    """Broker CPU seconds per GB (10^9 bytes) over every run of the named benchmarks."""
    chosen = [m for m in runs if m.name in names and not m.error]
    nbytes = sum(m.bytes for m in chosen)
    if nbytes <= 0:
        return None
    return sum(m.broker_cpu_s for m in chosen) / (nbytes / 1e9)


def ratio_text(sluice: float, kafka: float, higher_is_better: bool) -> str:
    if kafka <= 0 or sluice <= 0:
        return "n/a"
    r = sluice / kafka
    if higher_is_better:
        return f"{r:.2f}"
    if abs(r - 1) < 0.005:
        return "1.00x (same)"
    return f"{r:.2f}x slower" if r > 1 else f"{1 / r:.2f}x faster"


def _fmt(v: float, label: str) -> str:
    if label == "records/s":
        return f"{v:,.0f}"
    return f"{v:,.1f}"


@dataclass
class Comparison:
    """Every run of both systems for one cluster size, and what the harness knows of the machine."""

    brokers: int
    runs: list[Measured]
    start_verdict_valid: bool = True
    start_reasons: list[str] = field(default_factory=list)
    label: str = ""  # "smoke" for a smoke run
    sluice_name: str = "Sluice"  # "Sluice (Kafka listener)" when Kafka's tools drove Sluice too

    def names(self) -> list[str]:
        seen: list[str] = []
        for m in self.runs:
            if m.name not in seen:
                seen.append(m.name)
        return seen

    def runs_of(self, system: str) -> list[Measured]:
        return [m for m in self.runs if m.system == system]

    def of(self, system: str, name: str) -> list[Measured]:
        return [m for m in self.runs if m.system == system and m.name == name]

    @property
    def valid(self) -> bool:
        return self.start_verdict_valid and all(m.valid for m in self.runs) and not any(m.error for m in self.runs)

    def reasons(self) -> list[str]:
        out = list(self.start_reasons)
        for m in self.runs:
            for r in m.reasons:
                out.append(f"{m.system} {m.name} run {m.run}: {r}")
            if m.error:
                out.append(f"{m.system} {m.name} run {m.run} failed: {m.error}")
        return out


def table(c: Comparison) -> str:
    """The side-by-side markdown table of one comparison."""
    plural, rf = ("s", " RF3") if c.brokers > 1 else ("", "")
    head = (f"| benchmark | figure | Kafka {c.brokers} node{plural}{rf} | "
            f"{c.sluice_name} {c.brokers} broker{plural}{rf} | "
            "Sluice/Kafka | "
            "broker CPU s/GB Kafka | broker CPU s/GB Sluice | load avg Kafka / Sluice | runs valid |")  # fmt: skip
    rows = [head, "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for name in c.names():
        ks, ss = c.of("kafka", name), c.of("sluice", name)
        if not ks or not ss:
            continue
        k, s = median_run(ks), median_run(ss)
        label, kv, higher = figure_of(k)
        _, sv, _ = figure_of(s)
        kc, sc = cpu_per_gb(ks, [name]), cpu_per_gb(ss, [name])
        if k.kind == "latency":
            kc = sc = None  # a paced run: CPU per GB is not comparable with full-speed runs
        loads = f"{_loads(ks)} / {_loads(ss)}"
        valid = sum(m.valid and not m.error for m in ks + ss)
        rows.append(
            f"| {name} | {label} | {_fmt(kv, label)} | {_fmt(sv, label)} | {ratio_text(sv, kv, higher)} | "
            f"{_cpu(kc)} | {_cpu(sc)} | {loads} | {valid}/{len(ks) + len(ss)} |"
        )
    for what, names in (("produced (produce and transactions benchmarks)", PRODUCING),
                        ("consumed (read_committed benchmark)", CONSUMING)):  # fmt: skip
        kc = cpu_per_gb(c.runs_of("kafka"), names)
        sc = cpu_per_gb(c.runs_of("sluice"), names)
        if kc is None and sc is None:
            continue
        r = ratio_text(sc or 0, kc or 0, higher_is_better=False).replace("slower", "more").replace("faster", "less")
        rows.append(f"| broker CPU per GB {what} | CPU s/GB | {_cpu(kc)} | {_cpu(sc)} | {r} | | | | |")
    return "\n".join(rows)


def _cpu(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def _loads(runs: Sequence[Measured]) -> str:
    return ",".join(f"{m.load_1m:.1f}" for m in runs)


def verdict_text(c: Comparison) -> str:
    if c.valid:
        return "VERDICT: valid (the machine was quiet during every run)"
    lines = ["VERDICT: NOT VALID: the figures above were taken on a busy machine or a run failed; do not quote them."]
    lines += [f"  - {r}" for r in c.reasons()]
    return "\n".join(lines)


def chart(c: Comparison, path: Path) -> bool:
    """A PNG: Sluice/Kafka per benchmark (above 1 is Sluice ahead, latency inverted so the same
    holds), and broker CPU per GB produced and consumed. False when matplotlib is missing."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return False
    names, ratios = [], []
    for name in c.names():
        ks, ss = c.of("kafka", name), c.of("sluice", name)
        if not ks or not ss:
            continue
        _, kv, higher = figure_of(median_run(ks))
        _, sv, _ = figure_of(median_run(ss))
        if kv > 0 and sv > 0:
            names.append(name + ("\n(Kafka p99 / Sluice p99)" if not higher else ""))
            ratios.append(sv / kv if higher else kv / sv)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    ax1.barh(names, ratios, color=["#3b7dd8" if r >= 1 else "#d8823b" for r in ratios])
    ax1.axvline(1.0, color="black", linewidth=1)
    ax1.set_xlabel("Sluice / Kafka (above 1: Sluice ahead)")
    ax1.invert_yaxis()
    groups = [("produced", PRODUCING), ("consumed", CONSUMING)]
    xs = range(len(groups))
    for off, system, color in ((-0.2, "kafka", "#777777"), (0.2, "sluice", "#3b7dd8")):
        vals = [cpu_per_gb(c.runs_of(system), n) or 0.0 for _, n in groups]
        ax2.bar([x + off for x in xs], vals, width=0.4, label=system.capitalize(), color=color)
    ax2.set_xticks(list(xs), [g for g, _ in groups])
    ax2.set_ylabel("broker CPU seconds per GB")
    ax2.legend()
    status = "valid" if c.valid else "NOT VALID (busy machine)"
    label = f"{c.label.upper()} run, " if c.label else ""
    fig.suptitle(f"{c.sluice_name} vs Apache Kafka, {c.brokers} broker(s): {label}{status}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
