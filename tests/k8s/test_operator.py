"""The operator against a real API server and real brokers (tests/k8s/sluice_on_k8s.py).

One Sluice cluster for the module: three broker processes on 127.0.0.10-12 with the Kubernetes
MetadataStore, their Pod objects, the operator (``sluice operator``) in a subprocess, both
Coordinators declared. The tests run in file order and leave the cluster whole (every broker
back and Ready) for the next one.

The brokers require declared transactional ids (transactional.id.declaration.required=true), so
every transactional producer here needs a TransactionalId resource first.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice import errors
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.metadata.topic_view import TopicView
from tests.support.k8s_env import KubeCluster

from .crds import install_crds
from .sluice_on_k8s import INTERNAL_PARTITIONS, SluiceOnK8s, wait_for

V1 = "sluice.dev/v1alpha1"


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def topic(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": V1, "kind": "Topic", "metadata": {"name": name}, "spec": spec}


def txn_id(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": V1,
        "kind": "TransactionalId",
        "metadata": {"name": name},
        "spec": {"transactionalId": name, **spec},
    }


@pytest.fixture(scope="module")
def sluice(k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceOnK8s]:
    install_crds(k8s)
    # The operator's own check of replicationFactor is what test_topic_status checks: without the
    # admission policy's binding (test_crds installs it) the API server admits any count.
    k8s.kubectl("delete", "validatingadmissionpolicybinding", "sluice-replication-factor", "--ignore-not-found")
    namespace = k8s.create_namespace("sluice-operator")
    cluster = SluiceOnK8s(k8s, namespace, tmp_path_factory.mktemp("sluice-k8s"))
    try:
        k8s.kubectl("apply", "-n", namespace, "-f", str(Path(__file__).parents[2] / "manifests/operator/peering.yaml"))
        cluster.start({"transactional.id.declaration.required": "true"})
        cluster.start_operator()
        for kind in ("transaction", "group"):
            cluster.apply(
                {
                    "apiVersion": V1,
                    "kind": "Coordinator",
                    "metadata": {"name": f"{kind}s"},
                    "spec": {"type": kind, "partitions": INTERNAL_PARTITIONS, "replicationFactor": 3},
                }
            )
        yield cluster
    finally:
        cluster.close()


# -- topics -----------------------------------------------------------------------------------------


def test_topics_become_real_topics_with_status(sluice: SluiceOnK8s) -> None:
    sluice.apply(topic("orders", partitions=3, replicationFactor=3, config={"retention.ms": "3600000"}))

    def ready() -> dict[str, Any] | None:
        obj = sluice.get("topics", "orders")
        current = obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and condition(obj, "Ready").get("status") == "True" else None

    obj = wait_for(ready, 60, "Topic orders Ready", logs=sluice.logs)
    status = obj["status"]
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert [p["partition"] for p in status["partitions"]] == [0, 1, 2]
    with Admin(sluice.bootstrap_servers) as admin:
        described = admin.describe_topic("orders")
        assert status["topicId"] == described.topic_id
        assert described.config.get("retention.ms") == "3600000"
        for row, p in zip(status["partitions"], described.partitions, strict=True):
            assert (row["leader"], row["replicas"], sorted(row["isr"])) == (p.leader, p.replicas, sorted(p.isr))
            assert sorted(row["replicas"]) == [0, 1, 2] and row["leader"] == row["replicas"][0]
    assert obj["metadata"]["finalizers"] == ["sluice.dev/finalizer"]
    table = sluice.k8s.kubectl("get", "topics", "-n", sluice.namespace).stdout
    assert "orders" in table.splitlines()[1] and "True" in table.splitlines()[1]

    # The topic works: produce and consume through the brokers.
    producer = Producer(sluice.bootstrap_servers)
    for i in range(30):
        producer.send("orders", value=f"v{i}".encode(), partition=i % 3)
    producer.flush()
    producer.close()
    consumer = Consumer(sluice.bootstrap_servers, group_id=None)
    consumer.assign([TopicPartition("orders", p) for p in range(3)])
    consumer.seek_to_beginning()
    seen: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(seen) < 30 and time.monotonic() < deadline:
        seen.extend(r.value for r in consumer.poll(timeout=0.5) if r.value is not None)
    consumer.close()
    assert sorted(seen) == sorted(f"v{i}".encode() for i in range(30))

    # Grow it, change its config: the real topic follows.
    sluice.apply(topic("orders", partitions=5, replicationFactor=3, config={"retention.ms": "7200000"}))
    wait_for(lambda: len(sluice.leaders("orders")) == 5, 30, "orders grown to 5 partitions", logs=sluice.logs)
    wait_for(
        lambda: len(sluice.get("topics", "orders")["status"]["partitions"]) == 5, 30, "status rows", logs=sluice.logs
    )
    wait_for(
        lambda: (sluice.topic_doc("orders") or {}).get("config", {}).get("retention.ms") == "7200000",
        30,
        "the new retention.ms",
        logs=sluice.logs,
    )


def test_what_the_operator_cannot_do_is_reported_as_conditions(sluice: SluiceOnK8s) -> None:
    # A replication factor above the broker count (the API server's policy is off for this module).
    sluice.apply(topic("too-wide", partitions=1, replicationFactor=4))
    obj = wait_for(
        lambda: (o := sluice.get("topics", "too-wide")) and condition(o, "Ready").get("reason") and o,
        30,
        "a verdict on too-wide",
        logs=sluice.logs,
    )
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidReplicationFactor"), ready
    assert "exceeds the 3 broker(s)" in ready["message"]
    assert sluice.topic_doc("too-wide") is None
    # Changing the replication factor of an existing topic: NotSupported, the topic keeps 3.
    sluice.apply(topic("orders", partitions=5, replicationFactor=2, config={"retention.ms": "7200000"}))
    obj = wait_for(
        lambda: (o := sluice.get("topics", "orders")) and condition(o, "NotSupported").get("status") == "True" and o,
        30,
        "NotSupported on orders",
        logs=sluice.logs,
    )
    assert "replication factor is not supported" in condition(obj, "NotSupported")["message"]
    assert (sluice.topic_doc("orders") or {})["replication_factor"] == 3
    sluice.apply(topic("orders", partitions=5, replicationFactor=3, config={"retention.ms": "7200000"}))
    wait_for(
        lambda: condition(sluice.get("topics", "orders"), "NotSupported").get("status") == "False",
        30,
        "NotSupported cleared",
        logs=sluice.logs,
    )
    # A config the brokers refuse.
    sluice.apply(topic("bad-config", partitions=1, replicationFactor=1, config={"no.such.setting": "1"}))
    obj = wait_for(
        lambda: (o := sluice.get("topics", "bad-config")) and condition(o, "Ready").get("reason") and o,
        30,
        "a verdict on bad-config",
        logs=sluice.logs,
    )
    assert condition(obj, "Ready")["status"] == "False" and "no.such.setting" in condition(obj, "Ready")["message"]


def test_pause_and_delete(sluice: SluiceOnK8s) -> None:
    sluice.apply(topic("paused", partitions=1, replicationFactor=3))
    wait_for(lambda: len(sluice.leaders("paused")) == 1, 30, "topic paused created", logs=sluice.logs)
    sluice.k8s.kubectl("annotate", "topic", "paused", "-n", sluice.namespace, "sluice.dev/paused=true")
    sluice.k8s.kubectl(
        "patch", "topic", "paused", "-n", sluice.namespace, "--type=merge", "-p", '{"spec":{"partitions":4}}'
    )
    wait_for(
        lambda: condition(sluice.get("topics", "paused"), "Paused").get("status") == "True",
        30,
        "Paused",
        logs=sluice.logs,
    )
    time.sleep(4)  # longer than a reconcile interval (3 s): still nothing may change
    assert len(sluice.leaders("paused")) == 1
    sluice.k8s.kubectl("annotate", "topic", "paused", "-n", sluice.namespace, "sluice.dev/paused-")
    wait_for(lambda: len(sluice.leaders("paused")) == 4, 30, "the topic grown once unpaused", logs=sluice.logs)
    wait_for(
        lambda: condition(sluice.get("topics", "paused"), "Paused").get("status") == "False",
        30,
        "unpaused",
        logs=sluice.logs,
    )

    sluice.k8s.kubectl("delete", "topic", "paused", "-n", sluice.namespace, "--wait=true", "--timeout=60s")
    assert sluice.topic_doc("paused") is None
    with Admin(sluice.bootstrap_servers) as admin, pytest.raises(errors.UnknownTopicOrPartitionError):
        admin.describe_topic("paused")


# -- transactional ids ------------------------------------------------------------------------------


def test_transactional_id_status_follows_a_producer_and_the_resource_fences_it(sluice: SluiceOnK8s) -> None:
    # Undeclared ids are refused by the brokers.
    rogue = Producer(sluice.bootstrap_servers, transactional_id="rogue")
    with pytest.raises(errors.TransactionalIdAuthorizationFailedError):
        rogue.init_transactions(timeout=20)
    rogue.close()

    sluice.apply(txn_id("app-1", transactionTimeoutMs=4000))
    wait_for(
        lambda: condition(sluice.get("transactionalids", "app-1"), "Ready").get("status") == "True",
        30,
        "app-1 declared",
        logs=sluice.logs,
    )
    producer = Producer(sluice.bootstrap_servers, transactional_id="app-1", transaction_timeout_ms=60_000)
    producer.init_transactions(timeout=30)
    producer.begin_transaction()
    producer.send("orders", value=b"in-txn-1", partition=1)
    producer.flush()

    with Admin(sluice.bootstrap_servers) as admin:
        truth = admin.describe_transactions(["app-1"])[0]
    obj = wait_for(
        lambda: (
            (o := sluice.get("transactionalids", "app-1")) and (o.get("status") or {}).get("state") == "Ongoing" and o
        ),
        30,
        "status Ongoing",
        logs=sluice.logs,
    )
    st = obj["status"]
    assert (st["producerId"], st["producerEpoch"], st["coordinator"]) == (
        truth.producer_id,
        truth.producer_epoch,
        truth.coordinator_id,
    )
    assert st["partitions"] == ["orders-1"] and st["transactionStartTime"]

    # Open past the declared 4 s: Hanging.
    def hanging() -> dict[str, Any] | None:
        o = sluice.get("transactionalids", "app-1")
        return o if condition(o, "Hanging").get("status") == "True" else None

    obj = wait_for(hanging, 30, "Hanging", logs=sluice.logs)
    assert condition(obj, "Hanging")["reason"] == "TransactionTimedOut"
    row = sluice.k8s.kubectl("get", "transactionalids", "-n", sluice.namespace).stdout.splitlines()
    assert row[1].split()[:5] == ["app-1", "Ongoing", str(truth.producer_id), str(truth.producer_epoch),
                                  str(truth.coordinator_id)]  # fmt: skip

    # Fence through the resource: the live producer is fenced, its open transaction aborted.
    sluice.k8s.kubectl("patch", "transactionalid", "app-1", "-n", sluice.namespace, "--type=merge",
                       "-p", '{"spec":{"operation":{"type":"fence","requestId":"1"}}}')  # fmt: skip
    obj = wait_for(
        lambda: (
            (o := sluice.get("transactionalids", "app-1"))
            and ((o.get("status") or {}).get("lastOperation") or {}).get("requestId") == "1"
            and o
        ),
        30,
        "the fence operation",
        logs=sluice.logs,
    )
    assert obj["status"]["lastOperation"]["result"] == "Succeeded", obj["status"]["lastOperation"]
    with pytest.raises((errors.ProducerFencedError, errors.InvalidProducerEpochError)):
        producer.send("orders", value=b"after-fence", partition=1)
        producer.commit_transaction(timeout=30)
    producer.close()
    obj = wait_for(
        lambda: (
            (o := sluice.get("transactionalids", "app-1"))
            and (o.get("status") or {}).get("state") in ("CompleteAbort", "Empty")
            and o
        ),
        30,
        "the transaction aborted",
        logs=sluice.logs,
    )
    assert obj["status"]["producerEpoch"] > truth.producer_epoch
    assert condition(obj, "Hanging")["status"] == "False"
    consumer = Consumer(sluice.bootstrap_servers, group_id=None, isolation_level="read_committed")
    consumer.assign([TopicPartition("orders", 1)])
    consumer.seek_to_beginning()
    values: list[bytes] = []
    for _ in range(10):
        values.extend(r.value for r in consumer.poll(timeout=0.5) if r.value is not None)
    consumer.close()
    assert b"in-txn-1" not in values and b"after-fence" not in values

    # A new instance works again (with a new epoch); "abort" with nothing open is a no-op.
    again = Producer(sluice.bootstrap_servers, transactional_id="app-1")
    again.init_transactions(timeout=30)
    again.begin_transaction()
    again.send("orders", value=b"committed", partition=1)
    again.commit_transaction(timeout=30)
    again.close()
    sluice.k8s.kubectl("patch", "transactionalid", "app-1", "-n", sluice.namespace, "--type=merge",
                       "-p", '{"spec":{"operation":{"type":"abort","requestId":"2"}}}')  # fmt: skip
    obj = wait_for(
        lambda: (
            (o := sluice.get("transactionalids", "app-1"))
            and ((o.get("status") or {}).get("lastOperation") or {}).get("requestId") == "2"
            and o
        ),
        30,
        "the abort operation",
        logs=sluice.logs,
    )
    assert "no open transaction" in obj["status"]["lastOperation"]["message"]


def served(sluice: SluiceOnK8s, verb: str, plural: str) -> int:
    """``verb`` requests the API server has served for ``plural`` (its apiserver_request_total)."""
    from bench.metadata_scale import parse_metrics

    text = sluice.k8s.kubectl("get", "--raw", "/metrics").stdout
    return int(
        sum(
            value
            for _name, labels, value in parse_metrics(text, ("apiserver_request_total",))
            if labels.get("verb") == verb and labels.get("resource") == plural
        )
    )


def status_patches(sluice: SluiceOnK8s, plural: str) -> int:
    return served(sluice, "PATCH", plural)


def test_an_idle_transactional_id_costs_no_status_patches(sluice: SluiceOnK8s) -> None:
    """Its status round runs every second here and finds nothing new: no PATCH (issue 28)."""
    sluice.apply(txn_id("idle-1"))
    wait_for(
        lambda: condition(sluice.get("transactionalids", "idle-1"), "Ready").get("status") == "True",
        30,
        "idle-1 declared",
        logs=sluice.logs,
    )
    time.sleep(2.0)  # the first timer calls write the status that is then steady
    before = status_patches(sluice, "transactionalids")
    time.sleep(6.0)  # six timer calls of idle-1, and of every other TransactionalId of this module
    patched = status_patches(sluice, "transactionalids") - before
    print(f"\n{patched} PATCHes of transactionalids in 6 s (status rounds every 1 s)")
    assert patched <= 1, f"{patched} status PATCHes in 6 s for resources that did not change"


def test_status_rounds_read_the_same_whatever_the_number_of_ids(sluice: SluiceOnK8s) -> None:
    """60 more idle TransactionalIds cost the status rounds nothing per id: no GET of their
    documents, one LIST of the resources per round, no PATCH (a timer per id was a GET of its
    document, a LIST of the brokers and a DescribeTransactions, per id per interval)."""
    names = [f"many-{i:02d}" for i in range(60)]
    items = {"apiVersion": "v1", "kind": "List", "items": [txn_id(n) for n in names]}
    sluice.k8s.kubectl("apply", "-n", sluice.namespace, "-f", "-", input=json.dumps(items))

    def all_ready() -> bool:
        found = sluice.custom.list_namespaced_custom_object(
            "sluice.dev", "v1alpha1", sluice.namespace, "transactionalids"
        )
        ready = {o["metadata"]["name"] for o in found["items"] if condition(o, "Ready").get("status") == "True"}
        return ready >= set(names)

    wait_for(all_ready, 60, "60 TransactionalIds declared", logs=sluice.logs)
    time.sleep(2.0)  # the first rounds write the statuses that are then steady
    before = {(verb, plural): served(sluice, verb, plural) for verb, plural in READS}
    time.sleep(6.0)  # six rounds (every 1 s here)
    delta = {key: served(sluice, *key) - n for key, n in before.items()}
    print(f"\nrequests in 6 s with {len(names) + 3}+ idle TransactionalIds: {delta}")
    assert 3 <= delta[("LIST", "transactionalids")] <= 12, delta  # a round each second, one page each
    assert delta[("PATCH", "transactionalids")] <= 1, delta
    # The document GETs left are the Topic and Coordinator drift timers' (a few topics every 3 s);
    # a GET per id per round would be 360.
    assert delta[("GET", "metadatadocuments")] < 60, delta


READS = (("LIST", "transactionalids"), ("PATCH", "transactionalids"), ("GET", "metadatadocuments"))


def test_a_status_round_patches_at_most_its_budget_and_the_next_one_goes_on(
    sluice: SluiceOnK8s, k8s: KubeCluster
) -> None:
    """A round run by hand over another namespace (no operator there): seven resources whose status
    is stale, a budget of three: 3, 3, then 1 PATCH, in name order, then none."""
    from sluice.operator.transactional_id_statuses import TransactionalIdStatuses

    namespace = k8s.create_namespace("sluice-rounds")
    names = [f"stale-{i}" for i in range(7)]
    for name in names:
        sluice.custom.create_namespaced_custom_object(
            "sluice.dev", "v1alpha1", namespace, "transactionalids", txn_id(name)
        )
        sluice.custom.patch_namespaced_custom_object_status(
            "sluice.dev", "v1alpha1", namespace, "transactionalids", name,
            {"status": {"observedGeneration": 1, "state": "Stale"}},
        )  # fmt: skip
    sluice.custom.create_namespaced_custom_object(
        "sluice.dev", "v1alpha1", namespace, "transactionalids", txn_id("not-reconciled")
    )  # no observedGeneration: left to its handler
    with Admin(sluice.bootstrap_servers) as admin:
        rounds = TransactionalIdStatuses(sluice.custom, namespace, lambda: admin, interval_s=5, patch_budget=3)
        done = [rounds.run_round() for _ in range(4)]
    assert [(r.listed, r.changed, r.patched, r.unanswered) for r in done] == [
        (8, 7, 3, 0), (8, 4, 3, 0), (8, 1, 1, 0), (8, 0, 0, 0),
    ], done  # fmt: skip
    found = {
        o["metadata"]["name"]: o.get("status") or {}
        for o in sluice.custom.list_namespaced_custom_object("sluice.dev", "v1alpha1", namespace, "transactionalids")[
            "items"
        ]
    }
    for name in names:  # never used: what the coordinator says of such an id
        assert (found[name]["state"], found[name]["producerId"]) == ("Unknown", -1), found[name]
        assert condition({"status": found[name]}, "Hanging").get("reason") == "NoTransaction"
    assert "state" not in found["not-reconciled"]


def test_a_transactional_id_document_deleted_behind_the_operators_back_is_declared_again(
    sluice: SluiceOnK8s,
) -> None:
    """The status rounds' drift repair (every 12th round: 12 s here)."""
    key = "transactional_ids/many-07"
    found = sluice.store.get(key)
    assert found is not None and found.value is not None
    sluice.store.delete(key, found.version)
    back = wait_for(lambda: sluice.store.get(key), 40, "many-07 declared again", logs=sluice.logs)
    assert back.value == {"transactional_id": "many-07", "resource": f"{sluice.namespace}/many-07"}


def test_abort_through_the_resource_aborts_a_live_transaction(sluice: SluiceOnK8s) -> None:
    sluice.apply(txn_id("app-2"))
    wait_for(
        lambda: condition(sluice.get("transactionalids", "app-2"), "Ready").get("status") == "True",
        30,
        "app-2 declared",
        logs=sluice.logs,
    )
    producer = Producer(sluice.bootstrap_servers, transactional_id="app-2")
    producer.init_transactions(timeout=30)
    producer.begin_transaction()
    producer.send("orders", value=b"to-abort", partition=2)
    producer.flush()
    wait_for(
        lambda: sluice.get("transactionalids", "app-2")["status"]["state"] == "Ongoing", 30, "Ongoing", logs=sluice.logs
    )
    sluice.k8s.kubectl("patch", "transactionalid", "app-2", "-n", sluice.namespace, "--type=merge",
                       "-p", '{"spec":{"operation":{"type":"abort","requestId":"a"}}}')  # fmt: skip
    obj = wait_for(
        lambda: (
            (o := sluice.get("transactionalids", "app-2"))
            and ((o.get("status") or {}).get("lastOperation") or {}).get("requestId") == "a"
            and o
        ),
        30,
        "the abort operation",
        logs=sluice.logs,
    )
    assert obj["status"]["lastOperation"]["result"] == "Succeeded"
    assert "aborted the open transaction (partitions orders-2)" in obj["status"]["lastOperation"]["message"]
    with pytest.raises((errors.ProducerFencedError, errors.InvalidProducerEpochError)):
        producer.commit_transaction(timeout=30)
    producer.close()
    # The abort bumps the epoch (fencing the producer) and leaves the id Empty, as Kafka's fenceProducers.
    wait_for(
        lambda: sluice.get("transactionalids", "app-2")["status"]["state"] == "Empty", 30, "aborted", logs=sluice.logs
    )
    assert b"to-abort" not in read_committed(sluice, "orders", 5)


# -- failover ---------------------------------------------------------------------------------------

MESSAGES = 12000
TXN_SIZE = 100


class Copiers:
    def __init__(self, sluice: SluiceOnK8s, tag: str) -> None:
        self.sluice = sluice
        self.tag = tag
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        for i in range(2):
            log = open(self.sluice.workdir / f"copier-{self.tag}-{i}.log", "ab")  # noqa: SIM115
            self.procs[i] = subprocess.Popen(
                [
                    sys.executable, "-m", "sluice.cli.copier",
                    "--bootstrap-server", self.sluice.bootstrap_servers,
                    "--input", f"in-{self.tag}", "--output", f"out-{self.tag}", "--group", f"copiers-{self.tag}",
                    "--transactional-id", f"copier-{self.tag}-{i}", "--transaction-size", str(TXN_SIZE),
                    "--max-seconds", "240", "--partition", str(i),
                ],
                stdout=log, stderr=log,
            )  # fmt: skip

    def progress(self) -> int:
        return sum(
            (self.sluice.workdir / f"copier-{self.tag}-{i}.log").read_text().count('"committed"') for i in self.procs
        )

    def wait(self) -> dict[int, int | None]:
        out = {}
        for i, p in self.procs.items():
            try:
                out[i] = p.wait(300)
            except subprocess.TimeoutExpired:
                p.kill()
                out[i] = None
        return out

    def log_tail(self) -> str:
        return "\n".join(
            f"--- copier-{i}\n" + (self.sluice.workdir / f"copier-{self.tag}-{i}.log").read_text()[-2000:]
            for i in self.procs
        )


def led_by(sluice: SluiceOnK8s, broker: int) -> dict[str, list[int]]:
    """Partitions (of every topic, internal ones included) that ``broker`` leads, from the store
    (the topics composed with their partition change records)."""
    out: dict[str, list[int]] = {}
    for name, topic in TopicView.load(sluice.store).topics().items():
        parts = [i for i, p in enumerate(topic.partitions) if p.leader == broker]
        if parts:
            out[name] = parts
    return out


def preferred_everywhere(sluice: SluiceOnK8s) -> bool:
    topics = TopicView.load(sluice.store).topics().values()
    return all(p.leader == p.replicas[0] for topic in topics for p in topic.partitions)


def seed(sluice: SluiceOnK8s, tag: str) -> list[bytes]:
    sluice.apply(topic(f"in-{tag}", partitions=2, replicationFactor=3))
    sluice.apply(topic(f"out-{tag}", partitions=3, replicationFactor=3))
    for i in range(2):
        sluice.apply(txn_id(f"copier-{tag}-{i}"))
    for name in (f"in-{tag}", f"out-{tag}"):
        wait_for(
            lambda n=name: condition(sluice.get("topics", n), "Ready").get("status") == "True",
            60,
            f"Topic {name} Ready",
            logs=sluice.logs,
        )
    for i in range(2):
        wait_for(lambda i=i: condition(sluice.get("transactionalids", f"copier-{tag}-{i}"), "Ready").get("status")
                 == "True", 30, "copier ids declared", logs=sluice.logs)  # fmt: skip
    producer = Producer(sluice.bootstrap_servers, acks="all", linger_ms=5)
    sent = []
    for i in range(MESSAGES):
        value = f"{i % 2}:{i // 2}".encode()
        producer.send(f"in-{tag}", key=value, value=value, partition=i % 2)
        sent.append(value)
    producer.flush()
    producer.close()
    return sent


def read_committed(sluice: SluiceOnK8s, name: str, partitions: int) -> list[bytes]:
    consumer = Consumer(sluice.bootstrap_servers, group_id=None, isolation_level="read_committed")
    tps = [TopicPartition(name, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    ends = consumer.end_offsets(tps)
    out: list[bytes] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out.extend(r.value for r in consumer.poll(timeout=0.5) if r.value is not None)
        if all(consumer.position(tp) >= ends[tp] for tp in tps):
            break
    consumer.close()
    return out


@pytest.mark.parametrize("how", ["not-ready", "pod-deleted", "hung"])
def test_failover_when_a_broker_pod_fails(sluice: SluiceOnK8s, how: str) -> None:
    """Killed with its Pod NotReady, killed with its Pod deleted, or hung (SIGSTOP) with its Pod still
    Ready: the last is seen only by the operator's own health checks (the session timeout, 9 s)."""
    tag = {"not-ready": "nr", "pod-deleted": "del", "hung": "hung"}[how]
    sent = seed(sluice, tag)
    copiers = Copiers(sluice, tag)
    copiers.start()
    wait_for(lambda: copiers.progress() >= 4, 120, "the copiers' first commits", logs=sluice.logs)

    # The victim: the coordinator of copier 0's transactional id, so the coordinator must move too.
    with Admin(sluice.bootstrap_servers) as admin:
        victim = admin.describe_transactions([f"copier-{tag}-0"])[0].coordinator_id
    before = led_by(sluice, victim)
    assert "__transaction_state" in before and before, before
    killed_at = time.monotonic()
    if how == "hung":
        sluice.brokers[victim].pause()  # the kubelet's probe has not failed yet: the Pod stays Ready
    else:
        sluice.kill(victim)
    if how == "not-ready":
        sluice.set_ready(victim, False)
    elif how == "pod-deleted":
        sluice.delete_pod(victim)
    wait_for(lambda: not led_by(sluice, victim), 60, f"broker {victim}'s leaderships moving", logs=sluice.logs)
    failover_s = time.monotonic() - killed_at
    moved_count = sum(len(v) for v in before.values())
    print(f"\nfailover ({how}): every leadership of broker {victim} moved {failover_s:.2f} s after the kill "
          f"(pod grace period 2 s, session timeout 9 s; {moved_count} partitions)")  # fmt: skip

    # Statuses show it: the Topic and Coordinator rows no longer name the victim as leader.
    def statuses_moved() -> bool:
        rows = sluice.get("topics", f"out-{tag}")["status"]["partitions"]
        coordinators = sluice.get("coordinators", "transactions")["status"]["partitions"]
        return (
            all(r["leader"] != victim for r in rows)
            and all(r["coordinator"] != victim for r in coordinators)
            and all(victim not in r["isr"] for r in rows)
        )

    wait_for(statuses_moved, 30, "statuses to show the new leaders", logs=sluice.logs)
    events = sluice.events()
    moved = [
        e for e in events if e.get("reason") == "LeaderElected" and f"broker {victim} dead" in e.get("message", "")
    ]
    assert moved, [(e.get("reason"), e.get("message")) for e in events][-10:]
    assert {e["involvedObject"]["kind"] for e in moved} >= {"Coordinator"}

    # The broker comes back: preferred leaders return.
    time.sleep(1.0)
    if how == "hung":
        sluice.brokers[victim].resume()  # a zombie leader wakes up: it must learn it was deposed
    else:
        if how == "pod-deleted":
            sluice.create_pod(victim)  # what the StatefulSet does
        sluice.restart(victim)
        sluice.set_ready(victim, True)
    back_at = time.monotonic()
    wait_for(lambda: preferred_everywhere(sluice), 120, "preferred leaders to return", logs=sluice.logs)
    print(f"preferred leaders back {time.monotonic() - back_at:.2f} s after broker {victim} was Ready again")
    assert led_by(sluice, victim).keys() >= {"__transaction_state"}

    codes = copiers.wait()
    assert all(c == 0 for c in codes.values()), f"copiers ended with {codes}\n{copiers.log_tail()}\n{sluice.logs()}"
    copied = Counter(read_committed(sluice, f"out-{tag}", 3))
    assert [v for v, n in copied.items() if n > 1] == [], "duplicates in the output"
    assert set(copied) == set(sent), f"lost {len(set(sent) - set(copied))}"


# -- the operator itself fails ----------------------------------------------------------------------


def test_with_the_operator_stopped_the_cluster_works_and_it_catches_up(sluice: SluiceOnK8s) -> None:
    sluice.stop_operator()
    # Produce and consume go on: the brokers need the API server, not the operator.
    producer = Producer(sluice.bootstrap_servers)
    for i in range(20):
        producer.send("orders", value=f"while-away-{i}".encode(), partition=0)
    producer.flush()
    producer.close()
    values = read_committed(sluice, "orders", 5)
    assert sum(v.startswith(b"while-away-") for v in values) == 20
    # Changes while it is away: a new Topic, a grown one, a broker that dies.
    sluice.apply(topic("late", partitions=2, replicationFactor=3))
    sluice.apply(topic("orders", partitions=6, replicationFactor=3, config={"retention.ms": "7200000"}))
    victim = 2
    sluice.kill(victim)
    sluice.set_ready(victim, False)
    time.sleep(3)
    assert sluice.topic_doc("late") is None and len(sluice.leaders("orders")) == 5 and led_by(sluice, victim)

    sluice.start_operator()
    wait_for(
        lambda: condition(sluice.get("topics", "late"), "Ready").get("status") == "True",
        60,
        "late Ready",
        logs=sluice.logs,
    )
    wait_for(lambda: len(sluice.leaders("orders")) == 6, 60, "orders grown to 6", logs=sluice.logs)
    wait_for(lambda: not led_by(sluice, victim), 60, "leaderships of the broker that died meanwhile", logs=sluice.logs)
    sluice.restart(victim)
    sluice.set_ready(victim, True)
    wait_for(lambda: preferred_everywhere(sluice), 120, "preferred leaders to return", logs=sluice.logs)
    json.dumps(sluice.get("topics", "late"))  # the status is plain JSON


def test_two_operator_replicas_one_controller_and_a_takeover(sluice: SluiceOnK8s) -> None:
    """Two replicas: Kopf peering pairs them, one Lease holder runs the controller, the other takes over."""
    assert sluice.operator is not None
    wait_for(lambda: sluice.lease_holder() == "operator-a", 30, "operator-a holding the lease", logs=sluice.logs)
    second = sluice.start_second_operator("operator-b")
    wait_for(
        lambda: (
            len(sluice.k8s.kubectl_json("get", "kopfpeering", "sluice", "-n", sluice.namespace).get("status") or {})
            >= 2
        ),
        30,
        "both replicas in the KopfPeering",
        logs=sluice.logs,
    )
    time.sleep(3)
    assert sluice.lease_holder() == "operator-a"  # the second one waits

    # The active replica dies hard: the other takes the lease and handles the next broker failure.
    sluice.operator.kill()
    wait_for(lambda: sluice.lease_holder() == "operator-b", 30, "operator-b taking over the lease", logs=sluice.logs)
    victim = 1
    sluice.kill(victim)
    sluice.set_ready(victim, False)
    wait_for(lambda: not led_by(sluice, victim), 60, "failover by the second replica", logs=sluice.logs)
    assert "is the active controller" in second.log_path.read_text()
    sluice.restart(victim)
    sluice.set_ready(victim, True)
    wait_for(lambda: preferred_everywhere(sluice), 120, "preferred leaders to return", logs=sluice.logs)
