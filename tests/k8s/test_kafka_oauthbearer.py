"""SASL OAUTHBEARER on the Kafka listener, with ServiceAccount tokens checked by the real API server.

One broker process (its metadata in the test API server) serves ``--client-listener token`` and
``--kafka-listen``: its Kafka port is then SASL_SSL with the mechanism OAUTHBEARER, and the bearer
token is reviewed by the API server (TokenReview, audience ``sluice``) exactly as the gRPC token
listener's is (one authenticator for both ports). Tokens come from the TokenRequest API
(``kubectl create token``); forged and short-lived ones are signed by hand (tests/k8s/tokens.py).

* librdkafka (confluent-kafka, ``oauth_cb`` returning the token): a transactional producer and a
  read_committed consumer as ``ServiceAccount:<ns>:app``, refused without its ACLs and served
  with them; another account's token refused by the same ACLs;
* kafka-python (``sasl_oauth_token_provider``): the same, transactional produce and consume;
* refusals by librdkafka's own exchange: a forged token, a token for the API server's audience
  and an expired one each fail authentication with the broker's reason, and nothing is served;
* the protocol by hand (a TLS socket): a malformed client-first message is
  SASL_AUTHENTICATION_FAILED at once, a refused token gets the RFC 7628 error challenge and then
  SASL_AUTHENTICATION_FAILED, another mechanism UNSUPPORTED_SASL_MECHANISM, a request before
  authentication closes the connection unanswered, and a short-lived token's session ends with it;
* Apache Kafka's Java client (VerifiableProducer) with a token file, by configuration alone;
* re-authentication (KIP-368): librdkafka and kafka-python producers outlive several 8-second
  tokens on their connections.
"""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from cryptography.hazmat.primitives.asymmetric import ec

from sluice.broker.kafka.oauthbearer import client_first
from sluice.broker.kafka_wire.codec import Message, decode, encode
from sluice.broker.kafka_wire.messages.metadata_request import MetadataRequest
from sluice.broker.kafka_wire.messages.sasl_authenticate_request import SaslAuthenticateRequest
from sluice.broker.kafka_wire.messages.sasl_authenticate_response import SaslAuthenticateResponse
from sluice.broker.kafka_wire.messages.sasl_handshake_request import SaslHandshakeRequest
from sluice.broker.kafka_wire.messages.sasl_handshake_response import SaslHandshakeResponse
from sluice.client import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    Admin,
    ResourcePatternType,
    ResourceType,
)
from sluice.client import TopicPartition as GrpcTopicPartition
from tests.k8s.crds import install_crds
from tests.k8s.sluice_on_k8s import HOSTS, SluiceOnK8s, common_port
from tests.k8s.tokens import control_plane_signing_key, request_token, signed_token, start_token_cluster, write_token
from tests.support.k8s_env import KubeCluster, TestControlPlane

ACCOUNTS = ("admin", "app", "other")
SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM, TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 58, 33, 53


class Broker:
    def __init__(self, cluster: SluiceOnK8s, ca_file: Path, kafka_port: int, workdir: Path) -> None:
        self.cluster, self.ca_file, self.kafka_port, self.workdir = cluster, ca_file, kafka_port, workdir

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    @property
    def kafka_address(self) -> str:
        return f"{HOSTS[0]}:{self.kafka_port}"

    def admin(self, token: str) -> Admin:
        """The gRPC Admin with ``token`` (the super user's, to create topics and ACLs)."""
        path = write_token(self.workdir, f"admin-{uuid.uuid4().hex[:6]}", token)
        return Admin(
            bootstrap_servers=self.cluster.bootstrap_servers, security_protocol="SASL_SSL",
            ssl_cafile=str(self.ca_file), sasl_oauthbearer_token_file=str(path), request_timeout_ms=10_000,
        )  # fmt: skip

    def rdkafka(self, token: str, **conf: Any) -> dict[str, Any]:
        """librdkafka's settings for SASL_SSL with OAUTHBEARER, ``oauth_cb`` handing it ``token``."""
        return {
            "bootstrap.servers": self.kafka_address,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER",
            "ssl.ca.location": str(self.ca_file),
            "oauth_cb": lambda _config: (token, time.time() + 600),
            **conf,
        }

    def log(self) -> str:
        return self.cluster.brokers[0].log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def broker(k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    install_crds(k8s)
    ns = k8s.create_namespace("sluice-kafka-oauth")
    for account in ACCOUNTS:
        k8s.kubectl("create", "serviceaccount", account, "-n", ns)
    workdir = tmp_path_factory.mktemp("kafka-oauth")
    kafka_port = common_port(HOSTS[:1], after=common_port(HOSTS[:1]) + 20)
    cluster, ca_file = start_token_cluster(k8s, ns, workdir, f"ServiceAccount:{ns}:admin", kafka_port=kafka_port)
    try:
        yield Broker(cluster, ca_file, kafka_port, workdir)
    finally:
        cluster.close()
        k8s.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def allow(principal: str, kind: ResourceType, name: str, op: AclOperation) -> AclBinding:
    return AclBinding(kind, name, ResourcePatternType.LITERAL, principal, "*", op, AclPermissionType.ALLOW)


def transactional_acls(principal: str, topic: str, txn_id: str, group: str) -> list[AclBinding]:
    return [
        allow(principal, ResourceType.TRANSACTIONAL_ID, txn_id, AclOperation.WRITE),
        allow(principal, ResourceType.TOPIC, topic, AclOperation.WRITE),
        allow(principal, ResourceType.TOPIC, topic, AclOperation.READ),
        allow(principal, ResourceType.GROUP, group, AclOperation.READ),
    ]


def rd_read(broker: Broker, token: str, topic: str, group: str, count: int) -> list[bytes]:
    consumer = Consumer(broker.rdkafka(token, **{
        "group.id": group, "isolation.level": "read_committed", "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }))  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                raise KafkaException(message.error())
            values.append(message.value())
        return values
    finally:
        consumer.close()


def test_librdkafka_produces_and_consumes_transactionally_as_its_service_account(
    k8s: KubeCluster, broker: Broker
) -> None:
    ns = broker.namespace
    tokens = {a: request_token(k8s, ns, a) for a in ACCOUNTS}
    app = f"ServiceAccount:{ns}:app"
    with broker.admin(tokens["admin"]) as admin:
        admin.create_topic("rd-orders", 1, 1)

        # authenticated, but no ACL for its transactional id: Kafka's authorization error
        producer = Producer(broker.rdkafka(tokens["app"], **{"transactional.id": "rd-app"}))
        with pytest.raises(KafkaException) as refused:
            producer.init_transactions(30)
        assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        del producer

        admin.create_acls(transactional_acls(app, "rd-orders", "rd-app", "rd-readers"))
        producer = Producer(broker.rdkafka(tokens["app"], **{"transactional.id": "rd-app"}))
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(3):
            producer.produce("rd-orders", f"order-{i}".encode(), partition=0)
        producer.commit_transaction(30)
        assert rd_read(broker, tokens["app"], "rd-orders", "rd-readers", 3) == [b"order-0", b"order-1", b"order-2"]

        # another ServiceAccount's token: authenticated as itself, so the app's ACLs do not apply
        other = Producer(broker.rdkafka(tokens["other"], **{"transactional.id": "rd-app"}))
        with pytest.raises(KafkaException) as refused:
            other.init_transactions(30)
        assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        del other


def test_kafka_python_produces_and_consumes_transactionally_as_its_service_account(
    k8s: KubeCluster, broker: Broker
) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.net.sasl.oauth import AbstractTokenProvider

    ns = broker.namespace
    tokens = {a: request_token(k8s, ns, a) for a in ("admin", "app")}

    class Token(AbstractTokenProvider):  # type: ignore[misc]
        def token(self) -> str:
            return tokens["app"]

    settings: dict[str, Any] = {
        "bootstrap_servers": broker.kafka_address,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "OAUTHBEARER",
        "sasl_oauth_token_provider": Token(),
        "ssl_cafile": str(broker.ca_file),
    }
    with broker.admin(tokens["admin"]) as admin:
        admin.create_topic("kp-orders", 1, 1)
        admin.create_acls(transactional_acls(f"ServiceAccount:{ns}:app", "kp-orders", "kp-app", "kp-readers"))
    producer = KafkaProducer(**settings, transactional_id="kp-app")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(3):
            producer.send("kp-orders", f"order-{i}".encode(), partition=0)
        producer.commit_transaction()
    finally:
        producer.close()
    consumer = KafkaConsumer(
        **settings, group_id="kp-readers", isolation_level="read_committed", auto_offset_reset="earliest",
        enable_auto_commit=False, consumer_timeout_ms=20_000,
    )  # fmt: skip
    try:
        from kafka import TopicPartition as KpTopicPartition

        consumer.assign([KpTopicPartition("kp-orders", 0)])
        consumer.seek_to_beginning()
        values = [m.value for _, m in zip(range(3), consumer, strict=False)]
    finally:
        consumer.close()
    assert values == [b"order-0", b"order-1", b"order-2"]


def test_forged_foreign_and_expired_tokens_fail_librdkafkas_authentication_and_are_served_nothing(
    k8s: KubeCluster, control_plane: TestControlPlane, broker: Broker
) -> None:
    ns = broker.namespace
    uid = str(k8s.kubectl_json("get", "serviceaccount", "admin", "-n", ns)["metadata"]["uid"])  # type: ignore[index]
    key = control_plane_signing_key(control_plane.workdir)
    refused = {
        "forged": signed_token(ec.generate_private_key(ec.SECP256R1()), ns, "admin", uid, audience="sluice",
                               expires_in=600),
        "api-audience": request_token(k8s, ns, "admin", audience=None),
        "expired": signed_token(key, ns, "admin", uid, audience="sluice", expires_in=-60),
    }  # fmt: skip
    with broker.admin(request_token(k8s, ns, "admin")) as admin:
        admin.create_topic("rd-refused", 1, 1)
    delivered: list[KafkaError | None] = []
    for name, token in refused.items():
        errors: list[KafkaError] = []
        delivered.clear()
        producer = Producer(broker.rdkafka(token, error_cb=errors.append, **{
            "message.timeout.ms": 4000, "reconnect.backoff.ms": 1000, "log_level": 0,
        }))  # fmt: skip
        producer.produce("rd-refused", b"never", partition=0, on_delivery=lambda err, _msg: delivered.append(err))
        assert producer.flush(15) == 0
        assert len(delivered) == 1 and delivered[0] is not None, (name, delivered)  # never accepted
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), (name, errors)
        assert any("Authentication failed" in e.str() for e in errors), (name, errors)
        del producer
    # the same key with a future expiry is the super user's: it was the expiry that was refused
    fresh = signed_token(key, ns, "admin", uid, audience="sluice", expires_in=600)
    producer = Producer(broker.rdkafka(fresh))
    producer.produce("rd-refused", b"accepted", partition=0, on_delivery=lambda err, _msg: delivered.append(err))
    assert producer.flush(30) == 0 and delivered[-1] is None
    with broker.admin(request_token(k8s, ns, "admin")) as admin:  # the one accepted record is all there is
        assert (
            admin.list_offsets({GrpcTopicPartition("rd-refused", 0): Admin.LATEST})[
                GrpcTopicPartition("rd-refused", 0)
            ].offset
            == 1
        )
    log = broker.log()
    assert "is invalid for the target audiences" in log  # the API server's reason, in the broker's log
    assert "the token has expired" in log


# -- the protocol by hand ---------------------------------------------------------------------

SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA = 17, 36, 3


class Connection:
    """A TLS socket speaking Kafka requests at non-flexible versions (header v1, response header v0)."""

    def __init__(self, broker: Broker) -> None:
        context = ssl.create_default_context(cafile=str(broker.ca_file))
        raw = socket.create_connection((HOSTS[0], broker.kafka_port), timeout=30)
        self.sock = context.wrap_socket(raw, server_hostname=HOSTS[0])
        self.correlation = 0

    def send(self, key: int, version: int, body: Message) -> None:
        self.correlation += 1
        client = b"oauth-test"
        header = struct.pack(">hhih", key, version, self.correlation, len(client)) + client
        frame = header + encode(body, version)
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)

    def receive(self) -> bytes | None:
        """The response body, or None when the broker closed the connection instead."""
        head = self._exactly(4)
        if head is None:
            return None
        (size,) = struct.unpack(">i", head)
        frame = self._exactly(size)
        assert frame is not None, "closed inside a response"
        (correlation,) = struct.unpack_from(">i", frame)
        assert correlation == self.correlation
        return frame[4:]

    def _exactly(self, n: int) -> bytes | None:
        out = b""
        while len(out) < n:
            try:
                chunk = self.sock.recv(n - len(out))
            except (ConnectionResetError, ssl.SSLError):
                chunk = b""
            if not chunk:
                return None
            out += chunk
        return out

    def handshake(self, mechanism: str = "OAUTHBEARER") -> SaslHandshakeResponse:
        self.send(SASL_HANDSHAKE, 1, SaslHandshakeRequest(mechanism))
        body = self.receive()
        assert body is not None
        return decode(SaslHandshakeResponse, body, 1)

    def authenticate(self, auth_bytes: bytes) -> SaslAuthenticateResponse:
        self.send(SASL_AUTHENTICATE, 1, SaslAuthenticateRequest(auth_bytes))
        body = self.receive()
        assert body is not None
        return decode(SaslAuthenticateResponse, body, 1)

    def metadata_is_closed(self) -> bool:
        self.send(METADATA, 1, MetadataRequest(topics=None))
        return self.receive() is None

    def close(self) -> None:
        self.sock.close()


def test_the_sasl_exchanges_by_hand(k8s: KubeCluster, control_plane: TestControlPlane, broker: Broker) -> None:
    ns = broker.namespace
    # nothing is served before authentication: the connection is closed without an answer
    conn = Connection(broker)
    assert conn.metadata_is_closed()
    # a frame larger than sasl.server.max.receive.size before authentication: closed unread
    conn = Connection(broker)
    conn.sock.sendall(struct.pack(">i", 600 * 1024) + bytes(64))
    assert conn.receive() is None
    assert "exceeds sasl.server.max.receive.size (524288)" in broker.log()
    # another mechanism
    conn = Connection(broker)
    assert conn.handshake("PLAIN") == SaslHandshakeResponse(UNSUPPORTED_SASL_MECHANISM, ["OAUTHBEARER"])
    assert conn.receive() is None  # and closed
    # a malformed client-first message: SASL_AUTHENTICATION_FAILED at once, then closed
    conn = Connection(broker)
    assert conn.handshake() == SaslHandshakeResponse(0, ["OAUTHBEARER"])
    failed = conn.authenticate(b"n,,\x01auth=Basic YWxpY2U6cHc=\x01\x01")
    assert failed.error_code == SASL_AUTHENTICATION_FAILED
    assert str(failed.error_message).startswith("Invalid OAUTHBEARER client first message")
    assert conn.metadata_is_closed()
    # a refused token: the error challenge, the client's kvsep, then SASL_AUTHENTICATION_FAILED; closed
    conn = Connection(broker)
    conn.handshake()
    challenge = conn.authenticate(client_first(request_token(k8s, ns, "app", audience=None)))
    assert (challenge.error_code, challenge.auth_bytes) == (0, b'{"status":"invalid_token"}')
    failed = conn.authenticate(b"\x01")
    assert failed.error_code == SASL_AUTHENTICATION_FAILED
    assert str(failed.error_message).startswith("Authentication failed: the token was refused by the API server")
    assert 'is invalid for the target audiences ["sluice"]' in str(failed.error_message)
    assert conn.metadata_is_closed()
    # a valid token: served, with a session lifetime up to the token's expiry (10 minutes)
    conn = Connection(broker)
    conn.handshake()
    ok = conn.authenticate(client_first(request_token(k8s, ns, "app")))
    assert ok.error_code == 0 and 540_000 < ok.session_lifetime_ms <= 600_000
    assert not conn.metadata_is_closed()
    conn.close()
    # a short-lived token (signed with the control plane's key): the session ends with it
    uid = str(k8s.kubectl_json("get", "serviceaccount", "app", "-n", ns)["metadata"]["uid"])  # type: ignore[index]
    brief = signed_token(control_plane_signing_key(control_plane.workdir), ns, "app", uid, audience="sluice",
                         expires_in=4)  # fmt: skip
    conn = Connection(broker)
    conn.handshake()
    ok = conn.authenticate(client_first(brief))
    assert ok.error_code == 0 and 0 < ok.session_lifetime_ms <= 4000
    assert not conn.metadata_is_closed()
    time.sleep(ok.session_lifetime_ms / 1000 + 0.5)
    assert conn.metadata_is_closed()
    assert "the SASL session expired" in broker.log()


# -- Apache Kafka's Java client -----------------------------------------------------------------


def java_properties(broker: Broker, token_file: Path, path: Path) -> Path:
    """The Java client's settings for a ServiceAccount token in a file: configuration only (KIP-1139's
    FileJwtRetriever reads the file again at each refresh, as the kubelet rotates it)."""
    props = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;",
        "sasl.login.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        "sasl.oauthbearer.token.endpoint.url": token_file.as_uri(),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(broker.ca_file),
    }  # fmt: skip
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def run_java_tool(token_file: Path, main: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    from bench.kafka.cluster import java_command
    from bench.kafka.fetch import ensure_jars

    cmd = java_command(ensure_jars(), main, args, heap="256m", tool=True)
    # Kafka 4 reads OAuth token "endpoints" (a file: URL too) only from URLs allowed by this property
    cmd.insert(1, f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={token_file.as_uri()}")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)


def test_the_java_client_authenticates_with_a_token_file(k8s: KubeCluster, broker: Broker, tmp_path: Path) -> None:
    ns = broker.namespace
    with broker.admin(request_token(k8s, ns, "admin")) as admin:
        admin.create_topic("java-orders", 1, 1)
        admin.create_acls([allow(f"ServiceAccount:{ns}:app", ResourceType.TOPIC, "java-orders", AclOperation.WRITE)])
    token = write_token(tmp_path, "java-app", request_token(k8s, ns, "app"))
    config = java_properties(broker, token, tmp_path / "producer.properties")
    done = run_java_tool(token, "org.apache.kafka.tools.VerifiableProducer",
                         ["--bootstrap-server", broker.kafka_address, "--topic", "java-orders", "--max-messages",
                          "50", "--acks", "-1", "--command-config", str(config)])  # fmt: skip
    acked = [line for line in done.stdout.splitlines() if '"producer_send_success"' in line]
    assert done.returncode == 0 and len(acked) == 50, (done.stdout[-2000:], done.stderr[-3000:])
    # a token for the API server's audience: the client reports the broker's reason and sends nothing
    foreign = write_token(tmp_path, "java-foreign", request_token(k8s, ns, "app", audience=None))
    config = java_properties(broker, foreign, tmp_path / "foreign.properties")
    done = run_java_tool(foreign, "org.apache.kafka.tools.VerifiableProducer",
                         ["--bootstrap-server", broker.kafka_address, "--topic", "java-orders", "--max-messages",
                          "5", "--acks", "-1", "--command-config", str(config)])  # fmt: skip
    assert '"producer_send_success"' not in done.stdout
    assert "SaslAuthenticationException" in done.stdout + done.stderr, done.stderr[-3000:]
    with broker.admin(request_token(k8s, ns, "admin")) as admin:
        latest = admin.list_offsets({GrpcTopicPartition("java-orders", 0): Admin.LATEST})
        assert latest[GrpcTopicPartition("java-orders", 0)].offset == 50


def test_kafka_python_reauthenticates_before_a_short_lived_tokens_session_ends(
    k8s: KubeCluster, control_plane: TestControlPlane, broker: Broker
) -> None:
    """KIP-368: the broker answers a session lifetime up to the token's expiry; kafka-python
    re-authenticates on the open connection with a new token before then, so a producer outlives
    several tokens without its connection being closed for an expired session."""
    from kafka import KafkaProducer
    from kafka.net.sasl.oauth import AbstractTokenProvider

    ns = broker.namespace
    uid = str(k8s.kubectl_json("get", "serviceaccount", "app", "-n", ns)["metadata"]["uid"])  # type: ignore[index]
    key = control_plane_signing_key(control_plane.workdir)
    issued: list[str] = []

    class ShortLived(AbstractTokenProvider):  # type: ignore[misc]
        def token(self) -> str:
            issued.append(signed_token(key, ns, "app", uid, audience="sluice", expires_in=8))
            return issued[-1]

    with broker.admin(request_token(k8s, ns, "admin")) as admin:
        admin.create_topic("reauth", 1, 1)
        admin.create_acls([allow(f"ServiceAccount:{ns}:app", ResourceType.TOPIC, "reauth", AclOperation.WRITE)])
    expired_before = broker.log().count("the SASL session expired")
    producer = KafkaProducer(
        bootstrap_servers=broker.kafka_address, security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider=ShortLived(), ssl_cafile=str(broker.ca_file), acks="all",
    )  # fmt: skip
    try:
        for i in range(6):  # about 24 s: three tokens' lifetimes
            producer.send("reauth", f"r{i}".encode(), partition=0).get(timeout=20)
            time.sleep(4)
    finally:
        producer.close()
    assert len(issued) >= 4  # a token per connection at first, then one per re-authentication
    assert broker.log().count("the SASL session expired") == expired_before
    with broker.admin(request_token(k8s, ns, "admin")) as admin:
        latest = admin.list_offsets({GrpcTopicPartition("reauth", 0): Admin.LATEST})
        assert latest[GrpcTopicPartition("reauth", 0)].offset == 6


def test_librdkafka_reauthenticates_before_a_short_lived_tokens_session_ends(
    k8s: KubeCluster, control_plane: TestControlPlane, broker: Broker
) -> None:
    """The same with librdkafka: ``oauth_cb`` is asked for a new token as the old one nears its
    expiry, and the connection re-authenticates with it (KIP-368, librdkafka 2.2+)."""
    ns = broker.namespace
    uid = str(k8s.kubectl_json("get", "serviceaccount", "app", "-n", ns)["metadata"]["uid"])  # type: ignore[index]
    key = control_plane_signing_key(control_plane.workdir)
    issued: list[str] = []

    def short_lived(_config: str) -> tuple[str, float]:
        issued.append(signed_token(key, ns, "app", uid, audience="sluice", expires_in=8))
        return issued[-1], time.time() + 8

    with broker.admin(request_token(k8s, ns, "admin")) as admin:
        admin.create_topic("rd-reauth", 1, 1)
        admin.create_acls([allow(f"ServiceAccount:{ns}:app", ResourceType.TOPIC, "rd-reauth", AclOperation.WRITE)])
    expired_before = broker.log().count("the SASL session expired")
    producer = Producer({**broker.rdkafka("unused"), "oauth_cb": short_lived})
    delivered: list[KafkaError | None] = []
    for i in range(6):  # about 24 s: three tokens' lifetimes
        producer.produce("rd-reauth", f"r{i}".encode(), partition=0, on_delivery=lambda err, _m: delivered.append(err))
        assert producer.flush(20) == 0
        time.sleep(4)
    assert delivered == [None] * 6
    assert len(issued) >= 3
    assert broker.log().count("the SASL session expired") == expired_before
