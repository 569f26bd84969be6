"""Broker settings: Kafka's names, Kafka's defaults.

Every key a user can pass with ``--config KEY=VALUE`` is declared in
:data:`DEFAULTS` with its type; an unknown key or a value of the wrong type is
refused at start-up with a message naming it, rather than silently ignored.
Topic-level keys (retention.ms ...) double as broker-wide defaults, as in
Kafka where ``log.retention.ms`` sets the default of ``retention.ms``.

Every topic key that is accepted is read by the broker or the controller.
Kafka keys that mean nothing here are refused by name with the reason
(:data:`UNSUPPORTED_TOPIC_KEYS`, INVALID_CONFIG on CreateTopics) rather than
accepted and ignored: a user who sets ``segment.bytes`` learns that the log has
no segments instead of believing it took effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DAY_MS = 24 * 3600 * 1000

# key -> (type, default)
DEFAULTS: dict[str, tuple[type, Any]] = {
    # topics
    "num.partitions": (int, 1),
    "default.replication.factor": (int, 1),
    "min.insync.replicas": (int, 1),
    "retention.ms": (int, 7 * DAY_MS),
    "retention.bytes": (int, -1),
    "max.message.bytes": (int, 1024 * 1024 + 12),
    "message.timestamp.type": (str, "CreateTime"),
    # KIP-937 (Kafka 3.6), Kafka 4's defaults: CreateTime records any time in the past, at most 1 h ahead
    "message.timestamp.before.max.ms": (int, 9_223_372_036_854_775_807),
    "message.timestamp.after.max.ms": (int, 3_600_000),
    "cleanup.policy": (str, "delete"),
    "delete.retention.ms": (int, 86_400_000),
    "min.compaction.lag.ms": (int, 0),
    "log.retention.check.interval.ms": (int, 300_000),
    # transactions
    "transaction.state.log.num.partitions": (int, 50),
    "transaction.state.log.replication.factor": (int, 1),
    "transaction.max.timeout.ms": (int, 900_000),
    "transactional.id.expiration.ms": (int, 7 * DAY_MS),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (int, 10_000),
    "transaction.remove.expired.transaction.cleanup.interval.ms": (int, 3_600_000),
    # Sluice's own: only transactional ids declared by a TransactionalId resource (a
    # transactional_ids/<id> document, written by the operator) may be used; others get
    # TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    "transactional.id.declaration.required": (bool, False),
    # consumer groups
    "offsets.topic.num.partitions": (int, 50),
    "offsets.topic.replication.factor": (int, 1),
    "group.consumer.session.timeout.ms": (int, 45_000),
    "group.consumer.min.session.timeout.ms": (int, 1_000),
    "group.consumer.max.session.timeout.ms": (int, 300_000),
    "group.consumer.heartbeat.interval.ms": (int, 5_000),
    # the classic group protocol (Kafka listener's JoinGroup/SyncGroup): Kafka's keys and defaults, but
    # a bounded group size (Kafka's is unbounded): members and pending member ids per group
    "group.min.session.timeout.ms": (int, 6_000),
    "group.max.session.timeout.ms": (int, 1_800_000),
    "group.initial.rebalance.delay.ms": (int, 3_000),
    "group.classic.max.size": (int, 1_000),
    # Kafka's key, but Kafka's default is true: a Kafka client's Metadata request naming an unknown
    # topic (allow_auto_topic_creation, from v4) creates it with num.partitions and
    # default.replication.factor. Off by default: a typo in a topic name should fail, not create a
    # topic. Sluice's own (gRPC) clients never auto-create.
    "auto.create.topics.enable": (bool, False),
    # Sluice's own: a Kafka client's v2 batch is stored as sent (RecordBatch.records_format KAFKA_V2:
    # no record decoded on Produce or on a Kafka consumer's Fetch), once every replica of the partition
    # reads that format (a rolling upgrade needs no setting: docs/architecture.md, "Record formats
    # across versions"). false: always converted into Sluice's record encoding, as before that format
    # existed (the step before a downgrade to such brokers).
    "kafka.records.stored.as.sent": (bool, True),
    # requests
    "socket.request.max.bytes": (int, 100 * 1024 * 1024),
    # the Kafka listener (broker/sluice_broker/kafka): a connection idle this long is closed, as Kafka does
    "connections.max.idle.ms": (int, 600_000),
    # a token listener's Kafka port: SASL sessions end by then at the latest (KIP-368; 0: at the token's expiry)
    "connections.max.reauth.ms": (int, 0),
    # ... and the largest frame read from a client before its SASL authentication (Kafka's key and default)
    "sasl.server.max.receive.size": (int, 512 * 1024),
    "fetch.max.bytes": (int, 50 * 1024 * 1024),
    "replica.fetch.max.bytes": (int, 1024 * 1024),
    # replication (used from the replication work on; declared so configs can name them)
    "replica.lag.time.max.ms": (int, 30_000),
    # reassignment (Kafka's key, KIP-73): bytes/s this broker, as leader, sends to replicas being
    # added by a partition reassignment (sluice.broker.replication.throttle); <= 0: unthrottled
    "leader.replication.throttled.rate": (int, -1),
    # ... and bytes/s this broker fetches, as follower, for partitions it is being added to
    "follower.replication.throttled.rate": (int, -1),
    "unclean.leader.election.enable": (bool, False),
    "broker.rack": (str, ""),
    # controlled shutdown: on SIGTERM, hand leaderships over before stopping (broker/sluice_broker/main.py)
    "controlled.shutdown.enable": (bool, True),
    "controlled.shutdown.timeout.ms": (int, 30_000),
    # the data volume: warn (brokers/<id> document, controller log, Kubernetes Event) below this % free
    "log.dir.free.space.warn.percent": (int, 5),
    # RocksDB's flushes and compactions of the log directory together, bytes/s: the disk's budget
    # for this broker (sluice.broker.log.storage; docs/performance.md "RocksDB settings for the log")
    "log.background.write.max.bytes.per.second": (int, 192 * 1024 * 1024),
    # authorization (docs/security.md): Kafka's ACLs, checked against the caller's principal
    # (User:<CN> of its client certificate). Sluice's own switch (Kafka sets authorizer.class.name);
    # super.users and allow.everyone.if.no.acl.found are Kafka's keys (super users ';'-separated).
    "authorizer.enabled": (bool, False),
    "super.users": (str, ""),
    "allow.everyone.if.no.acl.found": (bool, False),
    # limits (docs/security.md): new producer ids (InitProducerId) one principal may obtain per
    # minute from this broker (Kafka's KIP-936 problem; 0: unlimited). Refused beyond it with
    # THROTTLING_QUOTA_EXCEEDED, which clients retry after a back-off.
    "producer.id.rate.per.principal.per.minute": (int, 6000),
    # byte-rate quotas per principal, bytes/s (Kafka's broker defaults of producer_byte_rate and
    # consumer_byte_rate; 0: unlimited): a principal over its rate gets its Produce / Fetch
    # responses held back by the throttle time, which the response reports (throttle_time_ms).
    "quota.producer.default": (int, 0),
    "quota.consumer.default": (int, 0),
    # connections per client address, on the client and Kafka listeners together (Kafka's keys;
    # security/connections.py): a connection beyond them is refused (the Kafka listener closes it,
    # gRPC answers its calls RESOURCE_EXHAUSTED). Overrides: "host:count,host:count".
    "max.connections.per.ip": (int, 1000),
    "max.connections.per.ip.overrides": (str, ""),
    "max.connections": (int, 2_147_483_647),
    # idle producers (Kafka's KIP-854 keys and defaults): a partition forgets the state of a producer
    # that wrote nothing for producer.id.expiration.ms and has no transaction open there, on every
    # replica, checked every producer.id.expiration.check.interval.ms.
    "producer.id.expiration.ms": (int, DAY_MS),
    "producer.id.expiration.check.interval.ms": (int, 600_000),
    # caps on what clients create (Sluice's own keys; Kafka has none): producer states one partition
    # keeps, and transactional ids one broker's transaction coordinator holds. A new one beyond the
    # cap is refused with POLICY_VIOLATION until expiry makes room.
    "producer.id.max.count.per.partition": (int, 10_000),
    "transactional.id.max.count": (int, 100_000),
    # register as reading partition change records (issue 28, docs/architecture.md): once every
    # registered broker does, the controller writes partition states as records. False registers
    # this broker as one of older code, which keeps every topic's states in its declaration.
    "metadata.partition.changes.enable": (bool, True),
    # test-only hooks (never set in production): see docs/architecture.md
    "sluice.test.hooks": (str, ""),
}

# Keys a topic may override, and the validation each gets. Each is read: by the partition log
# (retention, compaction, timestamps), the replica manager (max.message.bytes, min.insync.replicas)
# or the controller (unclean.leader.election.enable).
TOPIC_KEYS = {
    "retention.ms",
    "retention.bytes",
    "max.message.bytes",
    "message.timestamp.type",
    "message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms",
    "cleanup.policy",
    "min.insync.replicas",
    "unclean.leader.election.enable",
    "delete.retention.ms",
    "min.compaction.lag.ms",
}

_NON_NEGATIVE_TOPIC_KEYS = (
    "min.compaction.lag.ms",
    "message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms",
)

# Topic keys whose value is a comma-separated list (Kafka's ConfigDef type LIST): the only keys
# IncrementalAlterConfigs may APPEND to or SUBTRACT from (sluice.broker.topic_config_ops).
LIST_TOPIC_KEYS = frozenset({"cleanup.policy"})

# Kafka topic keys that have no meaning in Sluice, and why: refused by name, never silently ignored.
_NO_SEGMENTS = (
    "Sluice's log has no segments (each batch is its own RocksDB key, and retention and compaction "
    "drop whole batches); bound the log with retention.ms or retention.bytes"
)
UNSUPPORTED_TOPIC_KEYS = {
    "compression.type": (
        "the broker never recompresses: each batch is stored with the codec its producer chose (none, gzip, "
        "snappy, lz4, zstd); set compression on the producer (compression.type, sluice produce --compression)"
    ),
    "segment.bytes": _NO_SEGMENTS,
    "segment.ms": _NO_SEGMENTS,
    "segment.jitter.ms": _NO_SEGMENTS,
    "segment.index.bytes": _NO_SEGMENTS,
}


# Kafka's broker-level names of topic defaults: the broker setting message.max.bytes is the
# default of the topic setting max.message.bytes.
BROKER_KEY_ALIASES = {"message.max.bytes": "max.message.bytes"}

# Kafka broker keys Sluice does not implement, refused by name with the reason, never accepted
# and ignored. The value given first is accepted: it states what Sluice does anyway.
UNSUPPORTED_BROKER_KEYS: dict[str, tuple[str | None, str]] = {
    "offsets.retention.minutes": (None, "committed offsets do not expire in Sluice yet"),
}


CLIENT_LISTENERS = ("plaintext", "tls", "mtls", "token")


class ConfigError(ValueError):
    """A configuration key is unknown or its value has the wrong type."""


def parse_ip_overrides(text: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: ``"host:count,host:count"`` (Kafka's format) -> {host: count}."""
    out: dict[str, int] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.strip().isdigit():
            raise ConfigError(f"max.connections.per.ip.overrides: {item!r} is not host:count")
        out[host.strip().strip("[]")] = int(count)
    return out


def parse_value(key: str, kind: type, raw: Any) -> Any:
    if isinstance(raw, kind) and not (kind is int and isinstance(raw, bool)):
        return raw
    text = str(raw).strip()
    try:
        if kind is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if kind is int:
            return int(text)
        return text
    except ValueError:
        raise ConfigError(f"{key}: {raw!r} is not a valid {kind.__name__}") from None


def check_topic_key(key: str) -> None:
    """Refuse a key a topic cannot override: unknown, or a Kafka key with no meaning here (the reason)."""
    if key in UNSUPPORTED_TOPIC_KEYS:
        raise ConfigError(f"topic config {key!r} is not supported: {UNSUPPORTED_TOPIC_KEYS[key]}")
    if key not in TOPIC_KEYS:
        raise ConfigError(f"unknown topic config {key!r}; known: {', '.join(sorted(TOPIC_KEYS))}")


def validate_topic_config(config: Mapping[str, str]) -> dict[str, str]:
    """Check a topic's config overrides; returns them normalised as strings."""
    out: dict[str, str] = {}
    for key, raw in config.items():
        check_topic_key(key)
        kind = DEFAULTS[key][0]
        value = parse_value(key, kind, raw)
        if key == "cleanup.policy" and not set(str(value).split(",")) <= {"delete", "compact"}:
            raise ConfigError(f"cleanup.policy must be delete, compact or both, not {raw!r}")
        if key == "message.timestamp.type" and value not in ("CreateTime", "LogAppendTime"):
            raise ConfigError(f"message.timestamp.type must be CreateTime or LogAppendTime, not {raw!r}")
        if key in _NON_NEGATIVE_TOPIC_KEYS and value < 0:
            raise ConfigError(f"{key} must be >= 0, not {raw!r}")
        if key in ("retention.ms", "retention.bytes") and value < -1:
            raise ConfigError(f"{key} must be -1 (unlimited) or >= 0, not {raw!r}")
        if key in ("max.message.bytes", "min.insync.replicas") and value < 1:
            raise ConfigError(f"{key} must be positive, not {raw!r}")
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


@dataclass
class BrokerConfig:
    broker_id: int
    host: str
    port: int
    data_dir: str
    metadata_url: str
    values: dict[str, Any] = field(default_factory=dict)
    # The inter-broker listener (--inter-broker-listen, same host as the client listener; 0: none)
    # and the directory of its TLS material (--broker-tls-dir: ca.crt = the cluster CA, tls.crt and
    # tls.key = this broker's certificate). See sluice.broker.security.
    inter_broker_port: int = 0
    tls_dir: str = ""
    # The client listener (--client-listener): "plaintext", "tls" (this broker's certificate from
    # tls_dir), or "mtls" (client certificates required, from the clients CA in clients_ca), or
    # "token" (tls, and every call carries a ServiceAccount token checked with a TokenReview for
    # token_audience: sluice.broker.security.tokens).
    client_listener: str = "plaintext"
    clients_ca: str = ""
    token_audience: str = ""

    @classmethod
    def build(
        cls,
        broker_id: int,
        host: str,
        port: int,
        data_dir: str,
        metadata_url: str,
        overrides: Mapping[str, Any] | None = None,
        *,
        inter_broker_port: int = 0,
        tls_dir: str = "",
        client_listener: str = "plaintext",
        clients_ca: str = "",
        token_audience: str = "",
    ) -> BrokerConfig:
        values = {k: default for k, (_kind, default) in DEFAULTS.items()}
        given = dict(overrides or {})
        for alias, key in BROKER_KEY_ALIASES.items():
            if alias in given:
                if key in given and str(given[key]) != str(given[alias]):
                    raise ConfigError(f"{alias} and {key} name the same setting; give one")
                given[key] = given.pop(alias)
        for key, raw in given.items():
            if key in UNSUPPORTED_BROKER_KEYS:
                accepted, reason = UNSUPPORTED_BROKER_KEYS[key]
                if accepted is None or str(raw).strip().lower() != accepted:
                    raise ConfigError(f"broker config {key!r} is not supported: {reason}")
                continue
            if key not in DEFAULTS:
                raise ConfigError(f"unknown broker config {key!r}")
            values[key] = parse_value(key, DEFAULTS[key][0], raw)
        if values["log.background.write.max.bytes.per.second"] < 1024 * 1024:
            raise ConfigError("log.background.write.max.bytes.per.second must be at least 1048576 (1 MiB/s)")
        if not 0 <= values["log.dir.free.space.warn.percent"] <= 100:
            raise ConfigError("log.dir.free.space.warn.percent must be in [0, 100] (0: no warning)")
        for key in ("quota.producer.default", "quota.consumer.default"):
            if values[key] < 0:
                raise ConfigError(f"{key} must be >= 0 bytes/s (0: unlimited)")
        if values["producer.id.rate.per.principal.per.minute"] < 0:
            raise ConfigError("producer.id.rate.per.principal.per.minute must be >= 0 (0: unlimited)")
        for key in (
            "max.connections.per.ip", "max.connections", "producer.id.expiration.ms",
            "producer.id.expiration.check.interval.ms", "producer.id.max.count.per.partition",
            "transactional.id.max.count",
        ):  # fmt: skip
            if values[key] < 1:
                raise ConfigError(f"{key} must be positive, not {values[key]}")
        parse_ip_overrides(values["max.connections.per.ip.overrides"])
        if bool(inter_broker_port) != bool(tls_dir):
            raise ConfigError(
                "--inter-broker-listen and --broker-tls-dir go together: the inter-broker listener "
                "only serves peers proving a cluster certificate"
            )
        if client_listener not in CLIENT_LISTENERS:
            known = ", ".join(CLIENT_LISTENERS)
            raise ConfigError(f"--client-listener must be one of {known}, not {client_listener!r}")
        if client_listener != "plaintext" and not tls_dir:
            raise ConfigError(f"--client-listener {client_listener} needs --broker-tls-dir (the broker's certificate)")
        if (client_listener == "mtls") != bool(clients_ca):
            raise ConfigError("--clients-ca (the CA of client certificates) goes with --client-listener mtls, and only")
        if client_listener == "token":
            token_audience = token_audience or "sluice"
        elif token_audience:
            raise ConfigError("--token-audience goes with --client-listener token, and only")
        return cls(
            broker_id, host, port, data_dir, metadata_url, values,
            inter_broker_port, tls_dir, client_listener, clients_ca, token_audience,
        )  # fmt: skip

    def get(self, key: str) -> Any:
        return self.values[key]

    def int(self, key: str) -> int:
        return int(self.values[key])

    def topic_value(self, topic_config: Mapping[str, str], key: str) -> Any:
        """A topic setting: the topic's override, else the broker-wide default."""
        kind, _ = DEFAULTS[key]
        if key in topic_config:
            return parse_value(key, kind, topic_config[key])
        return self.values[key]

    def hook(self, name: str) -> bool:
        """Whether a test-only hook is switched on (``sluice.test.hooks=a,b``)."""
        return name in str(self.values["sluice.test.hooks"]).split(",")
