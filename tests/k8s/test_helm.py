"""The Helm chart: lint-clean, valid against a real API server, installs and uninstalls.

On the test control plane nothing runs (no kubelet, no controllers): what is checked is that
every object of the chart is accepted by the API server (schemas, CRDs, admission) and created,
with the settings the values ask for, and that `helm uninstall` removes them again. The contract
between the chart and the broker is checked by parsing the broker command line the chart renders
with the broker's own argument parser and configuration, as the container would.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.broker.config import BrokerConfig
from sluice.broker.main import build_config, parse_args, parse_metrics_listen
from sluice.testing import poll_until
from tests.support.k8s_env import KubeCluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sluice"
EXAMPLES = ROOT / "manifests" / "examples"


def render(k8s: KubeCluster, *args: str, namespace: str = "sluice", release: str = "sluice") -> list[dict[str, Any]]:
    out = k8s.helm("template", release, str(CHART), "--namespace", namespace, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in matches]}"
    return matches[0]


def install_crds(k8s: KubeCluster) -> None:
    """The chart's CRDs, applied and established (Helm itself only installs CRDs that are missing)."""
    k8s.kubectl("apply", "--server-side", "--field-manager=sluice-tests", "-f", str(CHART / "crds"))
    k8s.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CHART / "crds"))


def broker_config(statefulset: dict[str, Any], broker_id: int, namespace: str) -> BrokerConfig:
    """The broker's configuration from the StatefulSet's command line, as Kubernetes expands it."""
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    env = {"SLUICE_BROKER_ID": str(broker_id), "POD_IP": "10.244.0.7", "POD_NAMESPACE": namespace}
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    assert args[0] == "broker"
    return build_config(parse_args(args[1:]))


def test_helm_lint_is_clean(k8s: KubeCluster) -> None:
    for extra in ([], ["--set", "broker.replicas=1", "--set", "broker.podAntiAffinity=hard"]):
        result = k8s.helm("lint", "--strict", str(CHART), *extra)
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_bad_values_are_refused_with_a_clear_error(k8s: KubeCluster) -> None:
    result = k8s.helm("template", "x", str(CHART), "--set", "broker.podAntiAffinity=sometimes", check=False)
    assert result.returncode != 0
    assert 'broker.podAntiAffinity must be "soft", "hard" or ""' in result.stderr


def test_broker_command_line_is_one_the_broker_accepts(k8s: KubeCluster) -> None:
    docs = render(k8s, namespace="prod")
    sts = find(docs, "StatefulSet", "sluice-broker")
    config = broker_config(sts, broker_id=2, namespace="prod")
    assert config.broker_id == 2
    assert (config.host, config.port) == ("10.244.0.7", 9092)
    assert config.metadata_url == "kubernetes://prod"
    assert config.data_dir == "/var/lib/sluice"
    # The internal topics follow the two coordinators; replication defaults fit three brokers.
    assert config.int("transaction.state.log.num.partitions") == 50
    assert config.int("transaction.state.log.replication.factor") == 3
    assert config.int("offsets.topic.replication.factor") == 3
    assert config.int("default.replication.factor") == 3
    assert config.int("min.insync.replicas") == 2
    assert config.int("transaction.max.timeout.ms") == 900_000

    # One broker: every replication factor is capped, and broker.config wins over the chart.
    docs = render(k8s, "--set", "broker.replicas=1", "--set-string", "broker.config.retention\\.ms=3600000")
    config = broker_config(find(docs, "StatefulSet"), broker_id=0, namespace="sluice")
    assert config.int("transaction.state.log.replication.factor") == 1
    assert config.int("offsets.topic.replication.factor") == 1
    assert config.int("default.replication.factor") == 1
    assert config.int("min.insync.replicas") == 1
    assert config.int("retention.ms") == 3_600_000
    coordinators = [d for d in docs if d["kind"] == "Coordinator"]
    assert sorted(c["spec"]["replicationFactor"] for c in coordinators) == [1, 1]


def test_brokers_get_an_inter_broker_listener_with_the_cluster_ca(k8s: KubeCluster, tmp_path: Path) -> None:
    import base64

    from sluice import tls

    docs = render(k8s, "--set", "certificates.managedBy=helm")  # the operator's Secrets: test_certificates.py
    sts = find(docs, "StatefulSet")
    config = broker_config(sts, broker_id=0, namespace="sluice")
    assert config.inter_broker_port == 9093 and config.tls_dir == "/etc/sluice/broker-tls"
    pod = sts["spec"]["template"]["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "broker-tls")
    assert mount["mountPath"] == config.tls_dir and mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "broker-tls")
    secret = find(docs, "Secret", volume["secret"]["secretName"])
    for key, value in secret["data"].items():
        (tmp_path / key).write_bytes(base64.b64decode(value))
    material = tls.load_dir(tmp_path)  # what the broker loads: a CA and a broker certificate it signed
    assert tls.KeyPair(material.cert_pem, material.key_pem).common_name == "sluice-broker"
    own = render(k8s, "--set", "broker.interBroker.tlsSecret=mine")
    assert not [d for d in own if d["kind"] == "Secret"]
    assert find(own, "StatefulSet")["spec"]["template"]["spec"]["volumes"][-1]["secret"]["secretName"] == "mine"


def test_template_is_valid_against_the_api_server(k8s: KubeCluster, k8s_namespace: str) -> None:
    install_crds(k8s)
    docs = render(k8s, namespace=k8s_namespace)
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == sorted(
        {
            "ClusterRole",
            "ClusterRoleBinding",
            "Coordinator",
            "Deployment",
            "KopfPeering",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "StatefulSet",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        }
    )
    manifest = yaml.safe_dump_all(docs)
    out = k8s.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=sluice-tests",
        "-n",
        k8s_namespace,
        "-f",
        "-",
        input=manifest,
    ).stdout
    applied = [line for line in out.splitlines() if line.endswith("(server dry run)")]
    assert len(applied) == len(docs), out

    # The server's validation is really in the loop: a broken object in the same stream is refused.
    sts = find(docs, "StatefulSet")
    sts["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = 70000
    bad = k8s.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "-n",
        k8s_namespace,
        "-f",
        "-",
        input=yaml.safe_dump(sts),
        check=False,
    )
    assert bad.returncode != 0
    assert "readinessProbe.grpc.port" in bad.stderr


def test_examples_are_valid_against_the_api_server(k8s: KubeCluster, k8s_namespace: str) -> None:
    install_crds(k8s)
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert {f.name for f in files} >= {"topic.yaml", "transactionalid.yaml", "coordinators.yaml", "copier-job.yaml"}
    for f in files:
        out = k8s.kubectl(
            "apply",
            "--server-side",
            "--dry-run=server",
            "--field-manager=sluice-tests",
            "-n",
            k8s_namespace,
            "-f",
            str(f),
        ).stdout
        assert "(server dry run)" in out, f"{f.name}: {out}"


def _names(k8s: KubeCluster, namespace: str, kinds: str) -> set[str]:
    out = k8s.kubectl("get", kinds, "-n", namespace, "-l", "app.kubernetes.io/instance=rel", "-o", "name").stdout
    return set(out.split())


def test_install_creates_the_cluster_description_and_uninstall_removes_it(k8s: KubeCluster, k8s_namespace: str) -> None:
    ns = k8s_namespace
    k8s.helm(
        "install",
        "rel",
        str(CHART),
        "--namespace",
        ns,
        "--set",
        "broker.replicas=3",
        "--set",
        "broker.storage.size=2Gi",
        "--set",
        "broker.storage.storageClass=fast",
    )
    status = k8s.helm("status", "rel", "--namespace", ns).stdout
    assert "STATUS: deployed" in status
    assert "kubectl -n " + ns + " rollout status statefulset/rel-sluice-broker" in status  # NOTES.txt

    kinds = (
        "statefulsets,deployments,services,poddisruptionbudgets,serviceaccounts,roles,rolebindings,coordinators,"
        "kopfpeerings"
    )
    assert _names(k8s, ns, kinds) == {
        "statefulset.apps/rel-sluice-broker",
        "deployment.apps/rel-sluice-operator",
        "service/rel-sluice",
        "service/rel-sluice-broker-headless",
        "poddisruptionbudget.policy/rel-sluice-broker",
        "serviceaccount/rel-sluice-broker",
        "serviceaccount/rel-sluice-operator",
        "role.rbac.authorization.k8s.io/rel-sluice-broker",
        "role.rbac.authorization.k8s.io/rel-sluice-operator",
        "rolebinding.rbac.authorization.k8s.io/rel-sluice-broker",
        "rolebinding.rbac.authorization.k8s.io/rel-sluice-operator",
        "coordinator.sluice.dev/rel-sluice-transaction",
        "coordinator.sluice.dev/rel-sluice-group",
        "kopfpeering.kopf.dev/rel-sluice",
    }
    sts = k8s.kubectl_json("get", "statefulset", "rel-sluice-broker", "-n", ns)
    spec: Any = sts["spec"]
    assert spec["replicas"] == 3
    assert spec["serviceName"] == "rel-sluice-broker-headless"
    assert spec["podManagementPolicy"] == "Parallel"
    claim = spec["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"]["requests"]["storage"] == "2Gi"
    assert claim["storageClassName"] == "fast"
    container = spec["template"]["spec"]["containers"][0]
    # the client listener is TLS (ServiceAccount tokens): probes use the plaintext health port
    assert container["readinessProbe"]["grpc"] == {"port": 9094, "service": ""}
    assert container["livenessProbe"]["grpc"] == {"port": 9094, "service": "sluice.liveness"}
    assert spec["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]

    headless: Any = k8s.kubectl_json("get", "service", "rel-sluice-broker-headless", "-n", ns)["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    pdb: Any = k8s.kubectl_json("get", "pdb", "rel-sluice-broker", "-n", ns)["spec"]
    assert pdb["maxUnavailable"] == 1
    coord: Any = k8s.kubectl_json("get", "coordinator", "rel-sluice-transaction", "-n", ns)["spec"]
    assert (coord["type"], coord["partitions"], coord["replicationFactor"]) == ("transaction", 50, 3)
    cluster_role = f"rel-sluice-operator-{ns}"[:63].rstrip("-")
    assert k8s.kubectl("get", "clusterrole", cluster_role, check=False).returncode == 0
    assert k8s.kubectl("get", "validatingadmissionpolicy", f"sluice-replication-factor-{ns}"[:63]).returncode == 0

    k8s.helm("uninstall", "rel", "--namespace", ns, "--wait", "--timeout", "60s")
    assert _names(k8s, ns, kinds) == set()
    assert k8s.kubectl("get", "clusterrole", cluster_role, check=False).returncode != 0
    assert k8s.helm("status", "rel", "--namespace", ns, check=False).returncode != 0


def test_operator_and_broker_roles_are_least_privilege(k8s: KubeCluster, k8s_namespace: str) -> None:
    """As the chart's service accounts: each may do its job in its namespace, and nothing else."""
    ns = k8s_namespace
    k8s.helm("install", "rel", str(CHART), "--namespace", ns)
    try:
        broker = k8s.service_account_kubeconfig(ns, "rel-sluice-broker", create=False)
        operator = k8s.service_account_kubeconfig(ns, "rel-sluice-operator", create=False)

        def can(kubeconfig: Path, *args: str) -> bool:
            out = k8s.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False).stdout.strip()
            assert out in ("yes", "no"), out
            return out == "yes"

        # RBAC reaches the authorizer through a watch: wait (bounded) until the first grant of each
        # account is seen, so that the refusals after it are the roles' doing, not the delay's.
        assert poll_until(lambda: can(broker, "update", "metadatadocuments.sluice.dev", "-n", ns), timeout=15)
        assert poll_until(lambda: can(operator, "patch", "topics.sluice.dev/status", "-n", ns), timeout=15)
        assert can(broker, "watch", "metadatadocuments.sluice.dev", "-n", ns)
        assert not can(broker, "list", "topics.sluice.dev", "-n", ns)
        assert not can(broker, "get", "secrets", "-n", ns)
        assert not can(broker, "list", "metadatadocuments.sluice.dev", "-n", "default")
        assert can(broker, "create", "tokenreviews.authentication.k8s.io")  # the token listener
        assert not can(broker, "create", "subjectaccessreviews.authorization.k8s.io")
        assert can(operator, "patch", "sluiceusers.sluice.dev/status", "-n", ns)
        assert can(operator, "patch", "sluicerebalances.sluice.dev", "-n", ns)  # it removes the annotation
        assert can(operator, "patch", "sluicerebalances.sluice.dev/status", "-n", ns)
        assert not can(operator, "create", "sluicerebalances.sluice.dev", "-n", ns)  # rebalance.autoOnScaleUp off
        assert not can(broker, "list", "sluicerebalances.sluice.dev", "-n", ns)

        assert can(operator, "patch", "transactionalids.sluice.dev", "-n", ns)
        assert can(operator, "watch", "pods", "-n", ns)
        assert can(operator, "create", "events", "-n", ns)
        assert can(operator, "list", "customresourcedefinitions.apiextensions.k8s.io")
        assert not can(operator, "delete", "pods", "-n", ns)
        assert not can(operator, "get", "secrets", "-n", ns)
        assert not can(operator, "list", "topics.sluice.dev", "-n", "default")
        assert not can(operator, "create", "customresourcedefinitions.apiextensions.k8s.io")
        assert not can(operator, "list", "namespaces")  # Kopf's scanning is off: one named namespace
    finally:
        k8s.helm("uninstall", "rel", "--namespace", ns, check=False)


@pytest.mark.parametrize("replicas", [1, 5])
def test_coordinators_follow_the_broker_count(k8s: KubeCluster, replicas: int) -> None:
    docs = render(k8s, "--set", f"broker.replicas={replicas}")
    assert find(docs, "StatefulSet")["spec"]["replicas"] == replicas
    assert {c["spec"]["replicationFactor"] for c in docs if c["kind"] == "Coordinator"} == {min(3, replicas)}


def test_operator_command_line_and_environment_are_what_the_operator_reads(k8s: KubeCluster) -> None:
    from sluice.operator.main import parse_args as operator_args

    deployment = find(render(k8s, namespace="prod"), "Deployment", "sluice-operator")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {"POD_NAMESPACE": "prod"}
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    assert args[0] == "operator"
    parsed = operator_args(args[1:])
    assert parsed.namespace == "prod"
    assert parsed.peering == "sluice"  # the chart's KopfPeering object
    port = container["ports"][0]["containerPort"]
    assert parsed.liveness == f"http://0.0.0.0:{port}/healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"

    # Every SLUICE_* setting the chart hands the operator is one the operator reads.
    source = "\n".join(p.read_text() for p in (ROOT / "operator" / "sluice_operator").rglob("*.py"))
    settings = {e["name"] for e in container["env"] if e["name"].startswith("SLUICE_")}
    assert settings >= {"SLUICE_BROKER_SELECTOR", "SLUICE_BROKER_STATEFULSET", "SLUICE_FAILOVER_GRACE_SECONDS"}
    assert {s for s in settings if f'"{s}"' not in source} == set()
    assert "SLUICE_AUTO_REBALANCE_ON_SCALE_UP" not in settings  # off by default
    auto = find(render(k8s, "--set", "rebalance.autoOnScaleUp=true", namespace="prod"), "Deployment", "sluice-operator")
    auto_env = {e["name"]: e.get("value") for e in auto["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert auto_env["SLUICE_AUTO_REBALANCE_ON_SCALE_UP"] == "true" and '"SLUICE_AUTO_REBALANCE_ON_SCALE_UP"' in source
    selector = dict(
        kv.split("=")
        for kv in next(e["value"] for e in container["env"] if e["name"] == "SLUICE_BROKER_SELECTOR").split(",")
    )
    pod_labels = find(render(k8s, namespace="prod"), "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()


def test_broker_metrics_port_is_opened_on_the_pod_and_the_headless_service(k8s: KubeCluster) -> None:
    docs = render(k8s)
    container = find(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    listen = [a for a in container["args"] if a.startswith("--metrics-listen=")]
    assert listen == ["--metrics-listen=$(POD_IP):9404"]
    assert parse_metrics_listen(listen[0].split("=", 1)[1].replace("$(POD_IP)", "10.244.0.7")) == ("10.244.0.7", 9404)
    assert {"name": "metrics", "containerPort": 9404, "protocol": "TCP"} in container["ports"]
    headless = [d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"]
    assert len(headless) == 1 and any(p["name"] == "metrics" for p in headless[0]["spec"]["ports"])
    off = "\n".join(str(d) for d in render(k8s, "--set", "broker.metrics.enabled=false"))
    assert "metrics" not in off


def test_host_network_brokers_take_their_port_from_the_ordinal_and_advertise_the_node(k8s: KubeCluster) -> None:
    """hostNetwork.enabled: the command the container runs (through the same shell) gives broker N
    NODE:broker.port+N and NODE:metrics.port+N; no declared port (a host port, equal in every pod,
    would keep brokers apart); exec probes; the API server address for both kinds of pod."""
    docs = render(
        k8s,
        "--set",
        "hostNetwork.enabled=true",
        "--set",
        "hostNetwork.apiServer.host=127.0.0.1",
        "--set",
        "hostNetwork.apiServer.port=16443",
        namespace="prod",
    )
    sts = find(docs, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "ports" not in container
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["SLUICE_GRPC_PORT_BASE"], env["SLUICE_METRICS_PORT_BASE"]) == ("9092", "9404")
    # the inter-broker listener's base: 9093 would be broker 1's client port on a shared node
    assert env["SLUICE_INTERBROKER_PORT_BASE"] == "9192"
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "16443")
    for broker_id in (0, 2):
        # Run the container's own shell line with `sluice` replaced by printing its arguments.
        shell_env = {
            "HOST_IP": "192.0.2.2",
            "SLUICE_BROKER_ID": str(broker_id),
            "POD_NAMESPACE": "prod",
            "SLUICE_GRPC_PORT_BASE": "9092",
            "SLUICE_METRICS_PORT_BASE": "9404",
            "SLUICE_INTERBROKER_PORT_BASE": "9192",
            "PATH": "/usr/bin:/bin",
        }
        args = [re.sub(r"\$\((\w+)\)", lambda m, e=shell_env: e[m.group(1)], a) for a in container["args"]]
        script = container["command"][2].replace("exec sluice", "printf '%s\\n'")
        out = subprocess.run(
            [*container["command"][:2], script, *container["command"][3:], *args],
            env=shell_env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")[:-1]
        assert out[0] == "broker"
        config = build_config(parse_args(out[1:]))
        assert (config.broker_id, config.host, config.port) == (broker_id, "192.0.2.2", 9092 + broker_id)
        assert config.inter_broker_port == 9192 + broker_id
        metrics = next(a for a in out if a.startswith("--metrics-listen="))
        assert parse_metrics_listen(metrics.split("=", 1)[1]) == ("192.0.2.2", 9404 + broker_id)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["exec"]["command"][:2] == ["python", "-c"]
    assert container["readinessProbe"]["exec"]["command"][-1] == ""
    assert container["livenessProbe"]["exec"]["command"][-1] == "sluice.liveness"
    deployment = find(docs, "Deployment")["spec"]
    operator = deployment["template"]["spec"]
    assert operator["hostNetwork"] is True
    # the node's health port: a rollout replaces the operator pod in place, never beside it
    assert deployment["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    op_env = {e["name"]: e.get("value") for e in operator["containers"][0]["env"]}
    assert (op_env["KUBERNETES_SERVICE_HOST"], op_env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "16443")
    # Off by default: no host network, no API server override.
    default = find(render(k8s), "StatefulSet")["spec"]["template"]["spec"]
    assert "hostNetwork" not in default
    assert "strategy" not in find(render(k8s), "Deployment")["spec"]  # the default surge: pod IPs do not collide
    assert "KUBERNETES_SERVICE_HOST" not in str(default)


def test_host_network_refuses_an_operator_metrics_port_a_broker_takes(k8s: KubeCluster) -> None:
    """On one node broker N serves metrics on broker.metrics.port + N: the operator's port must
    not be one of them (it crash-looped broker 1 before the default moved below the range)."""
    refused = k8s.helm(
        "template",
        "sluice",
        str(CHART),
        "--set",
        "hostNetwork.enabled=true",
        "--set",
        "monitoring.operator.port=9405",
        check=False,
    )
    assert refused.returncode != 0
    assert "monitoring.operator.port 9405 is broker 1's metrics port" in refused.stderr
    render(k8s, "--set", "hostNetwork.enabled=true")  # the default port fits beside the brokers


def test_network_policies_open_each_port_to_whom_it_serves(k8s: KubeCluster, k8s_namespace: str) -> None:
    assert not [d for d in render(k8s) if d["kind"] == "NetworkPolicy"]  # off by default
    docs = render(k8s, "--set", "networkPolicy.enabled=true", namespace=k8s_namespace)
    brokers = find(docs, "NetworkPolicy", "sluice-broker")
    broker_pods = find(docs, "StatefulSet")["spec"]["selector"]["matchLabels"]
    assert brokers["spec"]["podSelector"]["matchLabels"] == broker_pods
    assert brokers["spec"]["policyTypes"] == ["Ingress"]
    rules = {r["ports"][0]["port"]: r.get("from") for r in brokers["spec"]["ingress"]}
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert rules == {
        9092: None,  # clients: from everywhere (authentication and ACLs decide the rest)
        9094: None,  # the health service alone, for the kubelet's probes (the client listener is TLS)
        9093: [{"podSelector": {"matchLabels": broker_pods}}],  # inter-broker: brokers only
        9404: monitoring,  # metrics: the monitoring namespace
    }
    operator = find(docs, "NetworkPolicy", "sluice-operator")
    operator_pods = find(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert operator["spec"]["podSelector"]["matchLabels"] == operator_pods
    assert {r["ports"][0]["port"]: r.get("from") for r in operator["spec"]["ingress"]} == {
        8080: None,  # the liveness probe
        9403: monitoring,
    }
    # the API server accepts both
    out = k8s.kubectl(
        "apply", "--server-side", "--dry-run=server", "--field-manager=sluice-tests", "-n", k8s_namespace,
        "-f", "-", input=yaml.safe_dump_all([brokers, operator]),
    ).stdout  # fmt: skip
    assert out.count("(server dry run)") == 2, out

    # clients restricted, metrics closed (no metrics rule at all), metrics off on the brokers
    custom = yaml.safe_dump(
        {
            "networkPolicy": {
                "enabled": True,
                "clients": {"from": [{"namespaceSelector": {"matchLabels": {"team": "payments"}}}]},
                "metrics": {"from": []},
            }
        }
    )
    result = k8s.helm("template", "sluice", str(CHART), "-f", "-", input=custom)
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    ingress = find(docs, "NetworkPolicy", "sluice-broker")["spec"]["ingress"]
    assert {r["ports"][0]["port"]: r.get("from") for r in ingress} == {
        9092: [{"namespaceSelector": {"matchLabels": {"team": "payments"}}}],
        9094: None,
        9093: [{"podSelector": {"matchLabels": broker_pods}}],
    }
    assert [r["ports"][0]["port"] for r in find(docs, "NetworkPolicy", "sluice-operator")["spec"]["ingress"]] == [8080]

    # host-network pods are outside NetworkPolicy: refused with a clear error
    bad = k8s.helm(
        "template", "x", str(CHART), "--set", "networkPolicy.enabled=true", "--set", "hostNetwork.enabled=true",
        check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "networkPolicy.enabled does not apply to hostNetwork.enabled" in bad.stderr


def test_the_default_client_listener_is_tls_with_service_account_tokens_and_the_authorizer_on(
    k8s: KubeCluster,
) -> None:
    docs = render(k8s, namespace="prod")
    sts = find(docs, "StatefulSet")
    config = broker_config(sts, broker_id=1, namespace="prod")
    assert (config.client_listener, config.token_audience) == ("token", "sluice")
    assert config.get("authorizer.enabled") is True
    assert config.get("super.users") == "ServiceAccount:prod:sluice-operator"  # the operator: a super user
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert "--health-listen=$(POD_IP):9094" in container["args"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"]["port"] == 9094
    assert {"name": "health", "containerPort": 9094, "protocol": "TCP"} in container["ports"]
    review = find(docs, "ClusterRole", "sluice-broker-prod-tokenreview")
    assert review["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    ]
    binding = find(docs, "ClusterRoleBinding", "sluice-broker-prod-tokenreview")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sluice-broker", "namespace": "prod"}]

    # The operator connects as a token client: the cluster CA alone (not the broker's key) and a
    # projected token for the brokers' audience, the files its settings name.
    from sluice.operator.settings import OperatorSettings

    pod = find(docs, "Deployment", "sluice-operator")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    settings = OperatorSettings.from_environment({"SLUICE_NAMESPACE": "prod", **{k: v for k, v in env.items() if v}})
    assert settings.broker_security() == {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": "/etc/sluice/broker-ca/ca.crt",
        "sasl_oauthbearer_token_file": "/var/run/secrets/sluice/token",
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["broker-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    token = volumes["broker-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "sluice" and token["path"] == "token"
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["broker-ca"] == "/etc/sluice/broker-ca" and mounts["broker-token"] == "/var/run/secrets/sluice"

    # Plaintext is a choice, with the authorizer off: none of the above.
    plain = render(k8s, "--set", "broker.clientAuth.listener=plaintext", "--set", "broker.authorizer.enabled=false")
    sts = find(plain, "StatefulSet")
    config = broker_config(sts, broker_id=0, namespace="sluice")
    assert config.client_listener == "plaintext" and config.get("authorizer.enabled") is False
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert not [a for a in container["args"] if a.startswith("--health-listen")]
    assert container["readinessProbe"]["grpc"]["port"] == 9092
    assert not [d for d in plain if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-tokenreview")]
    operator_env = find(plain, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert not [e for e in operator_env if e["name"] in ("SLUICE_BROKER_CA_FILE", "SLUICE_BROKER_TOKEN_FILE")]
    extra = render(k8s, "--set", "broker.authorizer.superUsers={User:alice,ServiceAccount:ops:admin}")
    assert broker_config(find(extra, "StatefulSet"), 0, "sluice").get("super.users") == (
        "ServiceAccount:sluice:sluice-operator;User:alice;ServiceAccount:ops:admin"
    )


def test_client_listener_values_that_cannot_work_are_refused(k8s: KubeCluster) -> None:
    mtls = ["--set", "broker.clientAuth.listener=mtls"]
    for args, message in (
        ([*mtls, "--set", "certificates.managedBy=helm"], '"mtls" needs the operator\'s clients CA'),
        ([*mtls, "--set", "broker.interBroker.tlsSecret=mine"], '"mtls" needs the operator\'s clients CA'),
        (["--set", "broker.clientAuth.listener=sasl"], 'must be "token", "mtls", "tls" or "plaintext", not "sasl"'),
        (["--set", "broker.clientAuth.listener=plaintext"], "every client is User:ANONYMOUS"),
        (["--set", "broker.clientAuth.listener=tls"], "every client is User:ANONYMOUS"),
    ):
        result = k8s.helm("template", "x", str(CHART), *args, check=False)
        assert result.returncode != 0 and message in result.stderr, result.stderr


def test_host_network_brokers_probe_their_tls_listener_with_the_cluster_ca(k8s: KubeCluster) -> None:
    docs = render(k8s, "--set", "hostNetwork.enabled=true")
    container = find(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SLUICE_CLIENT_LISTENER"] == "token"
    script = container["readinessProbe"]["exec"]["command"][2]
    assert "grpc.secure_channel" in script and "/etc/sluice/broker-tls/ca.crt" in script
    assert not [a for a in container["args"] if "--health-listen" in a]


def test_an_mtls_client_listener_verifies_clients_with_the_operators_clients_ca(
    k8s: KubeCluster, k8s_namespace: str
) -> None:
    from sluice.operator.settings import OperatorSettings

    docs = render(k8s, "--set", "broker.clientAuth.listener=mtls", namespace="prod")
    sts = find(docs, "StatefulSet")
    config = broker_config(sts, broker_id=2, namespace="prod")
    assert (config.client_listener, config.clients_ca) == ("mtls", "/etc/sluice/clients-ca/ca.crt")
    assert config.get("authorizer.enabled") is True
    assert config.get("super.users") == "User:sluice-operator"  # the operator's own certificate's CN
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert {"name": "clients-ca", "mountPath": "/etc/sluice/clients-ca", "readOnly": True} in container["volumeMounts"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["clients-ca"]["secret"] == {  # the certificate alone, read-only; the pod waits for it
        "secretName": "sluice-clients-ca-cert", "defaultMode": 0o400, "items": [{"key": "ca.crt", "path": "ca.crt"}]
    }  # fmt: skip
    assert "--health-listen=$(POD_IP):9094" in container["args"]  # the kubelet's probes present no certificate
    assert not [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-tokenreview")]

    # The operator owns the clients CA and connects with a certificate of its own from it.
    operator = find(docs, "Deployment", "sluice-operator")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in operator["containers"][0]["env"]}
    settings = OperatorSettings.from_environment({"SLUICE_NAMESPACE": "prod", **{k: v for k, v in env.items() if v}})
    assert (settings.clients_ca_secret, settings.clients_ca_cert_secret, settings.operator_client_secret) == (
        "sluice-clients-ca", "sluice-clients-ca-cert", "sluice-operator-client"
    )  # fmt: skip
    assert settings.broker_security() == {
        "security_protocol": "SSL",
        "ssl_cafile": "/etc/sluice/broker-ca/ca.crt",
        "ssl_certfile": "/etc/sluice/operator-client/tls.crt",
        "ssl_keyfile": "/etc/sluice/operator-client/tls.key",
    }
    own = {v["name"]: v for v in operator["volumes"]}["operator-client"]["secret"]
    assert own == {"secretName": "sluice-operator-client", "optional": True, "defaultMode": 0o400}
    role = find(docs, "Role", "sluice-operator")
    named = next(r for r in role["rules"] if r.get("resourceNames") and r["resources"] == ["secrets"])
    assert {"sluice-clients-ca", "sluice-clients-ca-cert", "sluice-operator-client"} <= set(named["resourceNames"])
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "update", "delete"]} in role["rules"]

    # Valid for the API server as a whole.
    install_crds(k8s)
    manifest = yaml.safe_dump_all(render(k8s, "--set", "broker.clientAuth.listener=mtls", namespace=k8s_namespace))
    out = k8s.kubectl(
        "apply", "--server-side", "--dry-run=server", "--field-manager=sluice-tests", "-n", k8s_namespace,
        "-f", "-", input=manifest,
    ).stdout  # fmt: skip
    assert "statefulset.apps/sluice-broker serverside-applied (server dry run)" in out, out

    # On the host network the exec probe presents the broker's own certificate (the cluster CA's).
    host = find(render(k8s, "--set", "broker.clientAuth.listener=mtls", "--set", "hostNetwork.enabled=true"),
                "StatefulSet")["spec"]["template"]["spec"]["containers"][0]  # fmt: skip
    assert {"name": "SLUICE_CLIENT_LISTENER", "value": "mtls"} in host["env"]
    assert "/etc/sluice/broker-tls/broker-" in host["readinessProbe"]["exec"]["command"][2]


def test_the_default_token_listener_makes_no_clients_ca_unless_asked(k8s: KubeCluster) -> None:
    def operator_env(*args: str) -> dict[str, str | None]:
        deployment = find(render(k8s, *args), "Deployment", "sluice-operator")
        return {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}

    default = render(k8s)
    assert not {"SLUICE_CLIENTS_CA_SECRET", "SLUICE_OPERATOR_CLIENT_SECRET"} & set(operator_env())
    assert broker_config(find(default, "StatefulSet"), 0, "sluice").client_listener == "token"
    role = find(default, "Role", "sluice-operator")
    assert not [r for r in role["rules"] if r["resources"] == ["secrets"] and "get" in r["verbs"]
                and not r.get("resourceNames")]  # fmt: skip
    # asked for: tls SluiceUsers get certificates beside a token listener; the brokers do not change
    asked = operator_env("--set", "certificates.clientsCa.enabled=true")
    assert asked["SLUICE_CLIENTS_CA_SECRET"] == "sluice-clients-ca"
    assert "SLUICE_OPERATOR_CLIENT_SECRET" not in asked
    sts = find(render(k8s, "--set", "certificates.clientsCa.enabled=true"), "StatefulSet")
    assert broker_config(sts, 0, "sluice").clients_ca == ""
