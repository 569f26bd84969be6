"""sluice.operator.metrics in-process: reconciliations counted by kind and result, drift repairs only
inside the drift timer, the endpoint served and its address checked."""

from __future__ import annotations

import urllib.request

import kopf
import pytest

from sluice.operator import metrics
from sluice.testing import free_port


def sample(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_handlers_are_counted_by_kind_and_result() -> None:
    calls: list[str] = []

    def handler(**kwargs: object) -> str:
        calls.append(str(kwargs["what"]))
        if kwargs["what"] == "wait":
            raise kopf.TemporaryError("not yet", delay=1)
        if kwargs["what"] == "fail":
            raise RuntimeError("boom")
        return "ok"

    wrapped = metrics.instrument("UnitKind", handler)
    assert wrapped.__name__ == "handler"  # Kopf derives handler ids from the name: unchanged
    before = {r: sample("sluice_operator_reconciliations_total", kind="UnitKind", result=r) for r in
              ("success", "retry", "error")}  # fmt: skip
    assert wrapped(what="ok") == "ok"
    with pytest.raises(kopf.TemporaryError):
        wrapped(what="wait")
    with pytest.raises(RuntimeError):
        wrapped(what="fail")
    for result in ("success", "retry", "error"):
        assert sample("sluice_operator_reconciliations_total", kind="UnitKind", result=result) == before[result] + 1
    assert sample("sluice_operator_reconcile_duration_seconds_count", kind="UnitKind") >= 3
    assert calls == ["ok", "wait", "fail"]


def test_drift_repairs_count_only_inside_the_drift_timer() -> None:
    def reconcile(**_: object) -> None:
        metrics.drift_repaired("UnitKind", "partitions")

    before = sample("sluice_operator_drift_repairs_total", kind="UnitKind", repair="partitions")
    metrics.instrument("UnitKind", reconcile)()  # a spec change: a reconciliation, not a repair
    assert sample("sluice_operator_drift_repairs_total", kind="UnitKind", repair="partitions") == before
    metrics.instrument("UnitKind", reconcile, drift_check=True)()
    assert sample("sluice_operator_drift_repairs_total", kind="UnitKind", repair="partitions") == before + 1
    metrics.drift_repaired("UnitKind", "partitions")  # outside any handler: the flag was reset
    assert sample("sluice_operator_drift_repairs_total", kind="UnitKind", repair="partitions") == before + 1


def test_the_endpoint_serves_the_registry_and_refuses_bad_addresses() -> None:
    port = free_port("127.0.0.1")
    server = metrics.serve(f"127.0.0.1:{port}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert "sluice_operator_offline_partitions" in text and "process_cpu_seconds_total" in text
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            metrics.serve(f"127.0.0.1:{port}")  # the port is taken
    finally:
        server.shutdown()
        server.server_close()
    for bad in ("9405", "host:", "host:99999", ":80"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            metrics.parse_listen(bad)


def test_rebalance_progress_sums_the_running_rebalances_and_forgets_finished_or_deleted_ones() -> None:
    from sluice.operator.handlers.rebalance import rebalance_event

    metrics.rebalance_progress("ns/a", {"total": 10, "done": 4, "inFlight": 3}, active=True)
    metrics.rebalance_progress("ns/b", {"total": 2, "done": 0, "inFlight": 2}, active=True)
    s = metrics.snapshot()
    assert s["sluice_operator_rebalance_partitions{state=total}"] == 12
    assert s["sluice_operator_rebalance_partitions{state=done}"] == 4
    assert s["sluice_operator_rebalance_partitions{state=in_flight}"] == 5
    assert s["sluice_operator_rebalances_running{}"] == 2
    metrics.rebalance_progress("ns/a", {"total": 10, "done": 10, "inFlight": 0}, active=False)  # Ready
    # memo without a runtime: no store to remove a throttle from, the metrics still forget it
    rebalance_event({"type": "DELETED", "object": {"metadata": {"namespace": "ns", "name": "b"}}}, memo=object())
    s = metrics.snapshot()
    assert s["sluice_operator_rebalances_running{}"] == 0
    assert s["sluice_operator_rebalance_partitions{state=total}"] == 0
