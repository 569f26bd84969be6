"""The chart's Kafka-protocol listener (kafka.enabled): flags the broker accepts, reachable ports,
an address each broker advertises that clients outside its pod can use, and the values refused.

As in test_helm.py, the broker command line the chart renders is parsed by the broker's own
argument parser (and the Kafka options by the broker's own parser of them), with the downward-API
variables expanded as Kubernetes does; on the host network the container's own shell line runs.
The objects are checked by the API server (a server-side dry run). The listener itself, reached
by a Kafka client through these addresses, is tested on the real node
(tests/node/test_kafka_and_spark_on_a_node.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from sluice.broker.kafka.options import KafkaOptions
from sluice.broker.main import parse_args
from tests.k8s.test_helm import CHART, find, install_crds, render
from tests.support.k8s_env import KubeCluster

NODE_VALUES = Path(__file__).resolve().parents[2] / "tools" / "k8s-node" / "values.yaml"
# The listener on, with a plaintext client listener and no authorizer (keys of the client-security
# values; set explicitly so these renders do not depend on their defaults).
ON = ("--set", "kafka.enabled=true", "--set", "broker.clientAuth.listener=plaintext",
      "--set", "broker.authorizer.enabled=false")  # fmt: skip


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(find(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0])


def kafka_options(args: list[str], env: dict[str, str]) -> KafkaOptions | None:
    """The broker's Kafka options from its container args, ``$(VAR)`` expanded as Kubernetes does."""
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]
    assert expanded[0] == "broker"
    parsed = parse_args(expanded[1:])
    return KafkaOptions.parse(parsed.kafka_listen, parsed.kafka_advertise)


def refusal(k8s: KubeCluster, *args: str) -> str:
    result = k8s.helm("template", "sluice", str(CHART), *args, check=False)
    assert result.returncode != 0, f"rendered although it should not: {args}"
    return result.stderr


def test_the_kafka_listener_is_off_by_default(k8s: KubeCluster) -> None:
    docs = render(k8s)
    text = yaml.safe_dump_all(docs)
    assert "kafka-listen" not in text and "name: kafka" not in text
    assert kafka_options(container(docs)["args"], {"SLUICE_BROKER_ID": "0", "POD_IP": "10.244.0.7",
                                                    "POD_NAMESPACE": "sluice"}) is None  # fmt: skip


def test_on_a_pod_network_each_broker_listens_on_its_pod_and_advertises_its_headless_name(
    k8s: KubeCluster, k8s_namespace: str
) -> None:
    docs = render(k8s, *ON, namespace="prod")
    broker = container(docs)
    env = {"SLUICE_BROKER_ID": "2", "POD_IP": "10.244.0.7", "POD_NAMESPACE": "prod", "POD_NAME": "sluice-broker-2"}
    options = kafka_options(broker["args"], env)
    assert options is not None
    assert options.listen == ("10.244.0.7", 9095)
    # The pod's stable name through the headless Service: what clients in the cluster resolve.
    assert options.advertise == ("sluice-broker-2.sluice-broker-headless.prod.svc.cluster.local", 9095)
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in broker["env"]
    assert {"name": "kafka", "containerPort": 9095, "protocol": "TCP"} in broker["ports"]
    for service in (d for d in docs if d["kind"] == "Service"):
        # the headless Service (per-pod names) and the client Service (bootstrap) both name it
        assert {"name": "kafka", "port": 9095, "targetPort": "kafka", "protocol": "TCP"} in service["spec"]["ports"]
    custom = render(k8s, *ON, "--set", "kafka.port=19092", "--set", "kafka.clusterDomain=corp.internal")
    options = kafka_options(container(custom)["args"], {**env, "POD_NAMESPACE": "sluice"})
    advertised = ("sluice-broker-2.sluice-broker-headless.sluice.svc.corp.internal", 19092)
    assert options == KafkaOptions(("10.244.0.7", 19092), advertised)

    # The API server accepts the objects (port names, numbers).
    install_crds(k8s)
    docs = render(k8s, *ON, namespace=k8s_namespace)
    out = k8s.kubectl(
        "apply", "--server-side", "--dry-run=server", "--field-manager=sluice-tests", "-n", k8s_namespace,
        "-f", "-", input=yaml.safe_dump_all(docs),
    ).stdout  # fmt: skip
    assert out.count("(server dry run)") == len(docs), out

    # A NetworkPolicy opens the Kafka port to the same clients as the gRPC port.
    policy = find(render(k8s, *ON, "--set", "networkPolicy.enabled=true"), "NetworkPolicy", "sluice-broker")
    clients = policy["spec"]["ingress"][0]
    assert [p["port"] for p in clients["ports"]] == [9092, 9095] and "from" not in clients


def test_on_the_host_network_broker_n_listens_and_advertises_node_address_at_the_kafka_base_plus_n(
    k8s: KubeCluster,
) -> None:
    docs = render(k8s, "-f", str(NODE_VALUES), namespace="prod")  # the node's values turn it on
    broker = container(docs)
    env_values = {e["name"]: e.get("value") for e in broker["env"]}
    assert env_values["SLUICE_KAFKA_PORT_BASE"] == "9292"
    assert "ports" not in broker  # no declared port on the host network (it would be a host port)
    for broker_id in (0, 2):
        # The container's own shell line, `sluice` replaced by printing its arguments.
        shell_env = {"HOST_IP": "192.0.2.2", "SLUICE_BROKER_ID": str(broker_id), "POD_NAMESPACE": "prod",
                     "SLUICE_GRPC_PORT_BASE": "9092", "SLUICE_METRICS_PORT_BASE": "9404",
                     "SLUICE_INTERBROKER_PORT_BASE": "9192", "SLUICE_KAFKA_PORT_BASE": "9292",
                     "PATH": "/usr/bin:/bin"}  # fmt: skip
        args = [re.sub(r"\$\((\w+)\)", lambda m, e=shell_env: e[m.group(1)], a) for a in broker["args"]]
        script = broker["command"][2].replace("exec sluice", "printf '%s\\n'")
        argv = [*broker["command"][:2], script, *broker["command"][3:], *args]
        out = subprocess.run(argv, env=shell_env, capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
        options = kafka_options(out, {})
        # No --kafka-advertise: the broker advertises its listen address, the node's, to clients.
        assert options == KafkaOptions(("192.0.2.2", 9292 + broker_id), None)
    notes = k8s.helm("install", "sluice", str(CHART), "-f", str(NODE_VALUES), "--dry-run").stdout
    assert "Kafka:    NODE:9292 + broker id" in notes


def test_values_that_cannot_work_are_refused_with_a_message_naming_them(k8s: KubeCluster) -> None:
    on = ON
    # The Kafka listener is secured as the client listener is (plaintext, tls, mtls; token: SASL_SSL
    # with OAUTHBEARER; the same ACLs). broker.clientAuth: the client-security values.
    render(k8s, *on, "--set", "broker.clientAuth.listener=token")
    render(k8s, *on, "--set", "broker.clientAuth.listener=tls")
    render(k8s, *on, "--set-string", "broker.config.authorizer\\.enabled=true")
    # A pod's ports: the Kafka port must be none of the others.
    assert "kafka.port 9093 is broker.interBroker.port too" in refusal(k8s, *on, "--set", "kafka.port=9093")
    assert "kafka.port 9404 is broker.metrics.port too" in refusal(k8s, *on, "--set", "kafka.port=9404")
    render(k8s, *on, "--set", "kafka.port=9404", "--set", "broker.metrics.enabled=false")
    # On the host network: ranges of one port per broker on the node, and the operator's ports.
    host = (*on, "--set", "hostNetwork.enabled=true")
    assert (
        "hostNetwork.kafkaPortBase 9093: the Kafka ports 9093-9095 (one per broker on the host network) overlap "
        "the brokers' client ports (broker.port + ordinal), 9092-9094"
    ) in refusal(k8s, *host, "--set", "hostNetwork.kafkaPortBase=9093")
    assert "overlap the metrics ports (broker.metrics.port + ordinal), 9404-9408" in refusal(
        k8s, *host, "--set", "hostNetwork.kafkaPortBase=9400", "--set", "broker.replicas=5"
    )
    assert "overlap the operator's metrics port (monitoring.operator.port), 9403" in refusal(
        k8s, *host, "--set", "hostNetwork.kafkaPortBase=9401"
    )
    assert "overlap the operator's health port (operator.healthPort), 18080" in refusal(
        k8s, *host, "--set", "hostNetwork.kafkaPortBase=18079", "--set", "operator.healthPort=18080"
    )
    # The default base fits beside everything else, with or without the operator.
    render(k8s, *host)
    # (without the operator, Helm makes the certificates: the chart's default has the operator own them)
    render(k8s, *host, "--set", "operator.enabled=false", "--set", "certificates.managedBy=helm",
           "--set", "hostNetwork.kafkaPortBase=18079", "--set", "operator.healthPort=18080")  # fmt: skip
