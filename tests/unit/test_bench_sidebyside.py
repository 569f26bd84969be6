"""bench/sidebyside.py and bench/kafka/perf.py's parsers: medians, ratios, CPU per GB, the table."""

from __future__ import annotations

from bench import sidebyside as sbs
from bench.kafka import perf


def run(system: str, name: str, mb: float, *, kind: str = "produce", p99: float | None = None, cpu: float = 1.0,
        nbytes: int = 10**9, valid: bool = True, error: str = "", rps: float = 0.0) -> sbs.Measured:  # fmt: skip
    return sbs.Measured(system=system, name=name, kind=kind, records=1000, bytes=nbytes, seconds=1.0, mb_per_s=mb,
                        records_per_s=rps, latency_ms={"p50": 1.0, "p99": p99} if p99 is not None else None,
                        broker_cpu_s=cpu, valid=valid, error=error)  # fmt: skip


def test_median_run_by_headline_figure() -> None:
    runs = [run("s", "produce-1KiB-acks-all", mb) for mb in (90.0, 120.0, 100.0)]
    assert sbs.median_run(runs).mb_per_s == 100.0
    lat = [run("s", "latency-10MBps-1KiB", 10, kind="latency", p99=p) for p in (30.0, 10.0, 20.0)]
    assert sbs.median_run(lat).latency_ms == {"p50": 1.0, "p99": 20.0}
    # a failed run ranks last, so it is the median only when most runs failed
    mixed = [run("s", "x", 50.0, error="boom"), run("s", "x", 80.0), run("s", "x", 60.0)]
    assert sbs.median_run(mixed).mb_per_s == 60.0


def test_figure_of_each_kind() -> None:
    assert sbs.figure_of(run("s", "produce-100B-acks-all", 10.0, rps=250_000)) == ("records/s", 250_000, True)
    assert sbs.figure_of(run("s", "latency-10MBps-1KiB", 10.0, kind="latency", p99=7.0)) == ("p99 ms", 7.0, False)
    assert sbs.figure_of(run("s", "produce-1KiB-acks-all", 99.5)) == ("MB/s", 99.5, True)


def test_ratio_text_directions() -> None:
    assert sbs.ratio_text(120.0, 100.0, True) == "1.20"
    assert sbs.ratio_text(15.0, 10.0, False) == "1.50x slower"
    assert sbs.ratio_text(5.0, 10.0, False) == "2.00x faster"
    assert sbs.ratio_text(10.0, 0.0, True) == "n/a"


def test_cpu_per_gb_is_total_cpu_over_total_bytes_without_failed_runs() -> None:
    runs = [run("s", "a", 1, cpu=2.0, nbytes=500_000_000), run("s", "b", 1, cpu=4.0, nbytes=1_500_000_000),
            run("s", "a", 1, cpu=100.0, nbytes=1, error="failed"), run("s", "c", 1, cpu=50.0)]  # fmt: skip
    assert sbs.cpu_per_gb(runs, ["a", "b"]) == 3.0  # 6 CPU s over 2 GB
    assert sbs.cpu_per_gb(runs, ["zzz"]) is None


def test_table_has_ratios_cpu_rows_and_the_verdict_refuses_busy_runs() -> None:
    runs = [
        run("kafka", "produce-1KiB-acks-all", 100.0, cpu=10.0), run("sluice", "produce-1KiB-acks-all", 110.0, cpu=5.0),
        run("kafka", "consume-read_committed-1KiB", 300.0, kind="consume", cpu=2.0),
        run("sluice", "consume-read_committed-1KiB", 330.0, kind="consume", cpu=3.0, valid=False),
        run("kafka", "latency-10MBps-1KiB", 10.0, kind="latency", p99=7.0),
        run("sluice", "latency-10MBps-1KiB", 10.0, kind="latency", p99=10.5),
    ]  # fmt: skip
    runs[3].reasons = ["other processes used 40%"]
    c = sbs.Comparison(brokers=3, runs=runs)
    md = sbs.table(c)
    assert "| Kafka 3 nodes RF3 | Sluice 3 brokers RF3 |" in md
    assert "| produce-1KiB-acks-all | MB/s | 100.0 | 110.0 | 1.10 | 10.0 | 5.0 |" in md
    assert "| latency-10MBps-1KiB | p99 ms | 7.0 | 10.5 | 1.50x slower |" in md
    produced = "| broker CPU per GB produced (produce and transactions benchmarks) | CPU s/GB |"
    assert f"{produced} 10.0 | 5.0 | 2.00x less |" in md
    assert "| broker CPU per GB consumed (read_committed benchmark) | CPU s/GB | 2.0 | 3.0 | 1.50x more |" in md
    assert not c.valid
    text = sbs.verdict_text(c)
    assert text.startswith("VERDICT: NOT VALID") and "other processes used 40%" in text
    runs[3].valid = True
    assert c.valid and sbs.verdict_text(c).startswith("VERDICT: valid")
    assert not sbs.Comparison(1, runs, start_verdict_valid=False, start_reasons=["load 8"]).valid


def test_parse_producer_performance_lines() -> None:
    out = "\n".join([
        "9766 records sent, 1952.8 records/sec (1.91 MB/sec), 5.3 ms avg latency, 88.0 ms max latency.",
        "29297 records sent, 9750.1 records/sec (9.52 MB/sec), 4.1 ms avg latency, 88.00 ms max latency, "
        "4 ms 50th, 8 ms 95th, 14 ms 99th, 40 ms 99.9th.",
        "27344 steady state records sent, 9760.0 records/sec (9.53 MB/sec), 3.9 ms avg latency, 30.00 ms max "
        "latency, 4 ms 50th, 7 ms 95th, 12 ms 99th, 25 ms 99.9th.",
    ])  # fmt: skip
    total = perf.parse_producer(out)
    assert total is not None and total.records == 29297 and total.latency_ms["p99"] == 14.0
    steady = perf.parse_producer(out, steady=True)
    assert steady is not None and steady.records == 27344 and steady.records_per_s == 9760.0
    assert steady.latency_ms["p99.9"] == 25.0
    assert perf.parse_producer("nothing here") is None


def test_parse_consumer_performance_header_and_row() -> None:
    out = (
        "[2026-11-25 01:50:00] WARN something (org.apache.kafka)\n"
        "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, "
        "fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec\n"
        "2026-11-25 01:50:01:000, 2026-11-25 01:50:03:000, 19.5, 9.7, 20000, 10000.0, 1428, 572, 34.1, 34965.0\n"
    )
    row = perf.parse_consumer(out)
    assert row is not None and row["data.consumed.in.nMsg"] == "20000" and row["fetch.time.ms"] == "572"
    assert perf.parse_consumer("no header") is None
