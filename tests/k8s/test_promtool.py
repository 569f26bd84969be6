"""``promtool check rules`` and ``promtool test rules`` on the chart's PrometheusRule (issue 14, item 4).

promtool is Prometheus' own rule parser and PromQL checker, built from the Go module proxy by
``tools/promtool/build.sh`` (cached in ``~/.cache/sluice-k8s/bin``; README's test command and
.ci/run build it). Missing, it is an error with the command that builds it, not a skip. The rules
pass ``check rules`` and a broken one fails it; ``test rules`` shows the main alerts firing on the
series they are meant for, and not on another namespace's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.k8s.test_monitoring import ALERTS, rule_groups
from tests.support.k8s_env import ControlPlaneError, KubeCluster, cache_dir


def promtool() -> Path:
    path = cache_dir() / "bin" / "promtool"
    if not path.exists():
        raise ControlPlaneError(f"missing {path}: build it with `bash tools/promtool/build.sh` (Go module proxy)")
    return path


def test_promtool_check_rules_passes_and_catches_a_broken_rule(k8s: KubeCluster, tmp_path: Path) -> None:
    tool = promtool()
    good = tmp_path / "rules.yaml"
    good.write_text(yaml.safe_dump(rule_groups(k8s)))
    result = subprocess.run([tool, "check", "rules", str(good)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout + result.stderr
    broken = rule_groups(k8s)
    broken["groups"][0]["rules"][0]["expr"] = "sum(kafka_server_replicamanager_underreplicatedpartitions > 0"
    bad = tmp_path / "broken.yaml"
    bad.write_text(yaml.safe_dump(broken))
    result = subprocess.run([tool, "check", "rules", str(bad)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr


def test_promtool_alerts_fire_on_their_series(k8s: KubeCluster, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(k8s)))
    ns = 'namespace="prod"'
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'kafka_server_replicamanager_underreplicatedpartitions{{{ns},pod="b0"}}',
                     "values": "0 2x20"},
                    {"series": f'kafka_server_replicamanager_underreplicatedpartitions{{{ns},pod="b1"}}',
                     "values": "0x20"},
                    # another release's broker: not this release's alert
                    {"series": 'kafka_server_replicamanager_underminisrpartitioncount{namespace="other",pod="b0"}',
                     "values": "1x20"},
                    {"series": f'kafka_consumergroup_lag_sum{{{ns},consumergroup="g",topic="t"}}',
                     "values": "2000+100x40"},
                    {"series": f'kafka_consumergroup_lag_sum{{{ns},consumergroup="steady",topic="t"}}',
                     "values": "5000x40"},
                    {"series": f'sluice_data_volume_free_bytes{{{ns},pod="b2"}}', "values": "5x20"},
                    {"series": f'sluice_data_volume_size_bytes{{{ns},pod="b2"}}', "values": "100x20"},
                    {"series": f'sluice_transaction_coordinator_open_transactions_past_timeout{{{ns},pod="b1"}}',
                     "values": "1x10"},
                ],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": "SluiceUnderReplicatedPartitions", "exp_alerts": []},
                    {
                        "eval_time": "10m",
                        "alertname": "SluiceUnderReplicatedPartitions",
                        "exp_alerts": [{"exp_labels": {"severity": "warning"}, "exp_annotations": {
                            "summary": "Partitions are under-replicated",
                            "description": "2 partitions have fewer in-sync replicas than replicas for 5 minutes "
                                           "(a broker is down or a follower cannot keep up).",
                        }}],
                    },
                    {"eval_time": "10m", "alertname": "SluiceUnderMinIsrPartitions", "exp_alerts": []},
                    {
                        "eval_time": "35m",
                        "alertname": "SluiceConsumerGroupLagGrowing",
                        "exp_alerts": [{"exp_labels": {"severity": "warning", "namespace": "prod",
                                                       "consumergroup": "g", "topic": "t"}, "exp_annotations": {
                            "summary": "A consumer group falls behind",
                            "description": "Consumer group g lags 5500 records on t and its lag has grown for 15 "
                                           "minutes.",
                        }}],
                    },
                    {
                        "eval_time": "10m",
                        "alertname": "SluiceDataVolumeAlmostFull",
                        "exp_alerts": [{"exp_labels": {"severity": "warning", "namespace": "prod", "pod": "b2"},
                                        "exp_annotations": {"summary": "A broker's data volume is almost full",
                                                            "description": "The data volume of b2 has 5% free."}}],
                    },
                    {
                        "eval_time": "5m",
                        "alertname": "SluiceTransactionPastTimeout",
                        "exp_alerts": [{"exp_labels": {"severity": "warning", "pod": "b1"}, "exp_annotations": {
                            "summary": "A transaction is open longer than its timeout",
                            "description": "1 transactions coordinated by b1 stay open past their "
                                           "transaction.timeout.ms (the coordinator's abort scan should have ended "
                                           "them).",
                        }}],
                    },
                ],
            }
        ],
    }  # fmt: skip
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool(), "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
