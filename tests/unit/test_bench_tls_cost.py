"""bench/tls_cost.py's report: which recorded runs it takes, and what it computes from them."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from bench.tls_cost import collect, markdown, summarize

SINCE = datetime.datetime(2026, 11, 26, 23, 0, tzinfo=datetime.UTC)


def run(name: str, mb_s: float, *, secure: bool, at: str = "2026-11-26T23:10:00+00:00", **extra: Any) -> dict[str, Any]:
    params = {"set": "standard", "brokers": 1, "secure": secure, **extra.pop("params", {})}
    return {"name": name, "mb_per_s": mb_s, "params": params, "started_at": at, "error": "", **extra}


def test_medians_and_ratio_of_the_runs_that_belong(tmp_path: Path) -> None:
    runs = [
        run("produce", 100.0, secure=False),
        run("produce", 80.0, secure=True),
        run("produce", 90.0, secure=False),
        run("produce", 84.0, secure=True),
        run("produce", 110.0, secure=False),
        run("produce", 88.0, secure=True),
        # not taken: before --since, another set, three brokers, a failed run
        run("produce", 1.0, secure=True, at="2026-11-26T22:59:59+00:00"),
        run("produce", 1.0, secure=True, params={"set": "quick"}),
        run("produce", 1.0, secure=True, params={"brokers": 3}),
        run("produce", 1.0, secure=True, error="boom"),
        # the latency benchmark is judged by its p99
        run("latency", 10.0, secure=False, latency_ms={"p99": 12.0}),
        run("latency", 10.0, secure=True, latency_ms={"p99": 15.0}),
        # plaintext only: no ratio, left out of the report
        run("consume", 150.0, secure=False),
    ]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(runs))
    rows = {r["benchmark"]: r for r in summarize(collect(path, SINCE, quick=False))}
    assert set(rows) == {"produce", "latency"}
    produce = rows["produce"]
    assert produce["plaintext"] == [100.0, 90.0, 110.0] and produce["secure"] == [80.0, 84.0, 88.0]
    assert (produce["plaintext_median"], produce["secure_median"], produce["ratio"]) == (100.0, 84.0, 0.84)
    assert rows["latency"]["unit"] == "p99 ms" and rows["latency"]["ratio"] == 1.25
    table = markdown(list(rows.values()), "title")
    assert "| produce | MB/s | 100.0, 90.0, 110.0 | 80.0, 84.0, 88.0 | 100.0 | 84.0 | 0.84 |" in table
