"""The engines behind `sluice bench`, `sluice demo` and the progress line, without a broker."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sluice.cli.engines import bench
from sluice.cli.engines.demo import DemoReport, run_demo
from sluice.cli.engines.progress import Progress
from sluice.testing import unique_topic_name


def test_percentiles() -> None:
    p = bench.percentiles([float(i) for i in range(1, 101)])
    assert (p["p50"], p["p95"], p["p99"], p["max"]) == (50.0, 95.0, 99.0, 100.0)
    assert bench.percentiles([])["p99"] == 0.0


def test_values_have_the_size_asked_and_are_compressible() -> None:
    import zlib

    values = bench.make_values(1024, n=4)
    assert {len(v) for v in values} == {1024}
    assert len(zlib.compress(values[0])) < 900


def test_results_are_appended(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "results.json"
    r = bench.BenchResult(name="x", kind="produce", params={"record_size": 1}).finish(1000, 1_000_000, 2.0)
    assert (r.records_per_s, r.mb_per_s) == (500.0, 0.5)
    bench.append_result(out, r)
    bench.append_result(out, {"name": "y"})
    runs = json.loads(out.read_text())
    assert [run["name"] for run in runs] == ["x", "y"]
    assert "500 records/s" in r.summary()


def test_corrupt_results_file_is_kept_aside(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    out.write_text("{not json")
    bench.append_result(out, {"name": "z"})
    assert json.loads(out.read_text()) == [{"name": "z"}]
    assert (tmp_path / "results.json.corrupt").exists()


def test_progress_on_a_pipe_prints_whole_lines() -> None:
    stream = io.StringIO()
    bar = Progress("copy", 10, stream=stream)
    bar.update(5, force=True)
    bar.message("hello")
    bar.close("done")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("copy: 5/10 records ( 50.0%)")
    assert lines[1:] == ["hello", "done"]
    quiet = io.StringIO()
    Progress("x", stream=quiet, enabled=False).update(1, force=True)
    assert quiet.getvalue() == ""


def test_demo_verdict() -> None:
    ok = DemoReport(input_records=10, output_records=10, offsets_at_end=True)
    assert ok.exactly_once
    assert "verdict: EXACTLY ONCE" in ok.render()
    for bad in (
        DemoReport(input_records=10, output_records=11, duplicates=1, offsets_at_end=True),
        DemoReport(input_records=10, output_records=9, lost=1, offsets_at_end=True),
        DemoReport(input_records=10, output_records=10, offsets_at_end=False),
        DemoReport(input_records=0, output_records=0, offsets_at_end=True),
    ):
        assert not bad.exactly_once
        assert "NOT EXACTLY ONCE" in bad.render()


def test_demo_refuses_abort_every_1() -> None:
    with pytest.raises(ValueError, match="abort_every"):
        run_demo(abort_every=1, bootstrap_servers="unused:1")


def test_unique_topic_names_are_legal_and_unique() -> None:
    names = {unique_topic_name("test_x[param one/two]") for _ in range(100)}
    assert len(names) == 100
    for name in names:
        assert name.replace("-", "").replace("_", "").replace(".", "").isalnum()
        assert not name.startswith("__") and len(name) <= 249
