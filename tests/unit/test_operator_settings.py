"""The operator's settings (sluice.operator.settings): read once, typed, clear errors naming the variable."""

from __future__ import annotations

import dataclasses

import kopf
import pytest

from sluice.operator.handlers import register
from sluice.operator.main import parse_args, settings_from
from sluice.operator.settings import DEFAULT_BROKER_SELECTOR, OperatorSettings, SettingsError


def test_defaults_and_values_from_the_environment() -> None:
    s = OperatorSettings.from_environment({"POD_NAMESPACE": "prod"})
    assert s == OperatorSettings(namespace="prod", metadata_url="kubernetes://prod")
    assert (s.broker_selector, s.failover_grace_s, s.reconcile_interval_s, s.status_interval_s) == (
        DEFAULT_BROKER_SELECTOR, 10.0, 30.0, 5.0
    )  # fmt: skip
    s = OperatorSettings.from_environment(
        {
            "POD_NAMESPACE": "prod",
            "SLUICE_NAMESPACE": "data",
            "SLUICE_METADATA": "/tmp/m.sqlite",
            "SLUICE_KUBECONFIG": "/k",
            "SLUICE_BROKER_SELECTOR": "app=b",
            "SLUICE_FAILOVER_GRACE_SECONDS": "2.5",
            "SLUICE_EXPECTED_BROKERS": "3",
            "SLUICE_BROKER_STATEFULSET": "sluice-broker",
            "SLUICE_PREFERRED_LEADER_DELAY_S": "0",
            "SLUICE_PREFERRED_LEADER_HOLD_S": "4.5",
            "SLUICE_RECONCILE_INTERVAL_S": "7",
            "SLUICE_STATUS_INTERVAL_S": "1",
            "SLUICE_PEERING": "p",
            "SLUICE_PEERING_PRIORITY": "42",
            "HOSTNAME": "operator-0",
        }
    )
    assert s == OperatorSettings(
        namespace="data",
        metadata_url="/tmp/m.sqlite",
        kubeconfig="/k",
        broker_selector="app=b",
        failover_grace_s=2.5,
        expected_brokers=3,
        broker_statefulset="sluice-broker",
        preferred_leader_delay_s=0.0,
        preferred_leader_hold_s=4.5,
        reconcile_interval_s=7.0,
        status_interval_s=1.0,
        peering_name="p",
        peering_priority=42,
        identity="operator-0",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.namespace = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SLUICE_RECONCILE_INTERVAL_S", "soon", "not a number"),
        ("SLUICE_RECONCILE_INTERVAL_S", "0", "greater than 0"),
        ("SLUICE_STATUS_INTERVAL_S", "-1", "greater than 0"),
        ("SLUICE_FAILOVER_GRACE_SECONDS", "-3", "at least 0"),
        ("SLUICE_PREFERRED_LEADER_DELAY_S", "nan", "finite"),
        ("SLUICE_PREFERRED_LEADER_HOLD_S", "-1", "at least 0"),
        ("SLUICE_EXPECTED_BROKERS", "three", "whole number"),
        ("SLUICE_EXPECTED_BROKERS", "-1", "at least 0"),
        ("SLUICE_PEERING_PRIORITY", "1.5", "whole number"),
        ("SLUICE_AUTO_REBALANCE_ON_SCALE_UP", "yes", "not true or false"),
        ("SLUICE_BROKER_SESSION_TIMEOUT_S", "-1", "at least 0"),
        ("SLUICE_BROKER_HEALTH_PORT", "70000", "not a port"),
        ("SLUICE_BROKER_HEALTH_PORT", "http", "whole number"),
    ],
)
def test_a_bad_value_names_its_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message) as info:
        OperatorSettings.from_environment({"POD_NAMESPACE": "prod", name: value})
    assert name in str(info.value)


def test_no_namespace_outside_a_pod_is_a_clear_error() -> None:
    with pytest.raises(SettingsError, match="SLUICE_NAMESPACE"):
        OperatorSettings.from_environment({})


def test_flags_win_over_the_environment() -> None:
    args = parse_args(["--namespace", "flagged", "--reconcile-interval-s", "2", "--brokers", "5"])
    s = settings_from(args, {"SLUICE_NAMESPACE": "env", "SLUICE_RECONCILE_INTERVAL_S": "9", "SLUICE_PEERING": "x"})
    assert (s.namespace, s.reconcile_interval_s, s.expected_brokers, s.peering_name) == ("flagged", 2.0, 5, "sluice")


def test_timers_take_their_intervals_from_the_settings() -> None:
    registry = kopf.OperatorRegistry()
    register(registry, OperatorSettings(namespace="n", metadata_url="x", reconcile_interval_s=7, status_interval_s=2))
    intervals = {h.id.rsplit("/", 1)[-1]: h.interval for h in registry._spawning.get_all_handlers()}
    assert intervals == {
        "topic_drift": 7,
        "coordinator_drift": 7,
        "user_drift": 7,
        "rebalance_tick": 2,
    }


def test_the_operators_own_client_certificate_goes_with_a_ca_file_and_no_token() -> None:
    base = {"SLUICE_NAMESPACE": "ns", "SLUICE_BROKER_CA_FILE": "/ca.crt"}
    pair = {"SLUICE_BROKER_CERT_FILE": "/c/tls.crt", "SLUICE_BROKER_KEY_FILE": "/c/tls.key"}
    assert OperatorSettings.from_environment({**base, **pair}).broker_security() == {
        "security_protocol": "SSL", "ssl_cafile": "/ca.crt", "ssl_certfile": "/c/tls.crt", "ssl_keyfile": "/c/tls.key",
    }  # fmt: skip
    for env, message in (
        ({**base, "SLUICE_BROKER_CERT_FILE": "/c/tls.crt"}, "go together"),
        ({"SLUICE_NAMESPACE": "ns", **pair}, "needs SLUICE_BROKER_CA_FILE"),
        ({**base, **pair, "SLUICE_BROKER_TOKEN_FILE": "/t"}, "no SLUICE_BROKER_TOKEN_FILE"),
    ):
        with pytest.raises(SettingsError, match=message):
            OperatorSettings.from_environment(env).broker_security()


def test_the_automatic_rebalance_on_scale_up_is_off_unless_asked() -> None:
    base = {"SLUICE_NAMESPACE": "n"}
    assert OperatorSettings.from_environment(base).auto_rebalance_on_scale_up is False
    on = OperatorSettings.from_environment({**base, "SLUICE_AUTO_REBALANCE_ON_SCALE_UP": "True"})
    assert on.auto_rebalance_on_scale_up is True
    registry = kopf.OperatorRegistry()
    register(registry, on)
    watched = {h.id.rsplit("/", 1)[-1] for h in registry._watching.get_all_handlers()}
    assert "broker_pod_event" in watched


def test_the_operators_own_health_checks_of_the_brokers() -> None:
    """On by default (9 s, Kafka's broker.session.timeout.ms), plaintext only: on the health port, or
    on the brokers' own address when they are plaintext; TLS brokers without a health port: Pods only."""
    env = {"POD_NAMESPACE": "prod"}
    assert OperatorSettings.from_environment(env).health_checks() == (9.0, None)
    assert OperatorSettings.from_environment({**env, "SLUICE_BROKER_HEALTH_PORT": "9094"}).health_checks() == (
        9.0,
        9094,
    )
    tls = {**env, "SLUICE_BROKER_CA_FILE": "/etc/ca.crt"}
    assert OperatorSettings.from_environment(tls).health_checks() == (0.0, None)
    assert OperatorSettings.from_environment({**tls, "SLUICE_BROKER_HEALTH_PORT": "9094"}).health_checks() == (
        9.0,
        9094,
    )
    off = {**env, "SLUICE_BROKER_SESSION_TIMEOUT_S": "0", "SLUICE_BROKER_HEALTH_PORT": "9094"}
    assert OperatorSettings.from_environment(off).health_checks() == (0.0, None)
    args = parse_args(["--namespace", "n", "--broker-session-timeout-s", "4"])
    assert settings_from(args, {}).health_checks() == (4.0, None)
