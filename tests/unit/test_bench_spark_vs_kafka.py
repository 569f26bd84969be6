"""bench/spark_vs_kafka.py: medians, ratios, the table and the verdict line, over made-up runs."""

from __future__ import annotations

from bench import spark_vs_kafka as svk
from bench import verdict


def run(route: str, direction: str, seconds: float, n: int = 1, *, error: str = "", valid: bool = True) -> svk.Run:
    return svk.Run(route, direction, 100, n, 1_000_000, seconds=seconds, broker_cpu_s=2.0, error=error, valid=valid)


def test_rates_and_median_run_skip_errors() -> None:
    runs = [run("sluice", "write", 4.0, 1), run("sluice", "write", 5.0, 2), run("sluice", "write", 2.0, 3, error="x")]
    assert runs[0].rows_per_s == 250_000 and runs[0].mb_per_s == 25.0
    assert runs[2].rows_per_s == 0.0
    m = svk.median_run(runs)
    assert m is not None and m.run == 2  # of two good runs, the lower middle
    assert svk.median_run([runs[2]]) is None


def test_cpu_per_gb_is_total_over_total() -> None:
    runs = [run("kafka-kafka", "read", 1.0), run("kafka-kafka", "read", 2.0)]
    assert svk.cpu_per_gb(runs) == 4.0 / 0.2  # 4 CPU s over 2 x 10^8 bytes


def test_table_ratios_to_kafka_on_kafka_and_eos_cost() -> None:
    runs = [
        run("sluice", "write", 10.0),
        run("kafka-sluice", "write", 5.0),
        run("kafka-kafka", "write", 4.0),
        run("sluice", "read", 2.0),
        run("kafka-kafka", "read", 4.0),
    ]
    md = svk.table(runs)
    lines = md.splitlines()
    assert lines[2].startswith('| write 100 B | format("sluice")') and "| 0.40 |" in lines[2]
    assert "| 0.80 |" in lines[3] and "| 1.00 |" in lines[4]
    assert lines[5].startswith("| read 100 B") and "| 2.00 |" in lines[5]
    assert len(lines) == 7  # no kafka-sluice read: no row
    (cost,) = svk.eos_cost(runs)
    assert "100,000 rows/s" in cost and "0.50x" in cost and "0.40x" in cost


def test_job_names_and_order() -> None:
    assert svk.job_name("read", 1024) == "read 1 KiB" and svk.job_name("write", 100) == "write 100 B"
    runs = [svk.Run("sluice", d, s, 1, 10, seconds=1.0) for d in ("read", "write") for s in (1024, 100)]
    assert svk.jobs(runs) == [("write", 100), ("read", 100), ("write", 1024), ("read", 1024)]


def test_verdict_line() -> None:
    quiet = verdict.Verdict()
    assert svk.verdict_line(quiet, [run("sluice", "write", 1.0)]).startswith("VERDICT: valid")
    busy = svk.verdict_line(quiet, [run("sluice", "write", 1.0, valid=False)])
    assert busy.startswith("VERDICT: NOT VALID") and "do not quote" in busy
    assert svk.verdict_line(quiet, [run("sluice", "write", 1.0, error="boom")]).startswith("VERDICT: ERRORS")


def test_rising_counts_increases_only() -> None:
    # 10 s of CPU, then a process leaves the tree with 4 s of it, then 1 s more
    assert svk.rising([10.0, 12.0, 8.0, 9.0]) == 3.0
    assert svk.rising([5.0]) == 0.0 and svk.rising([]) == 0.0


def test_a_system_that_stopped_early_is_an_error() -> None:
    line = svk.verdict_line(verdict.Verdict(), [run("sluice", "write", 1.0)], ["kafka stopped early: KafkaError: x"])
    assert line.startswith("VERDICT: ERRORS: kafka stopped early")
