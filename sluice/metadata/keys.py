"""Names of the documents Sluice keeps in the MetadataStore, and their JSON shapes.

Each shape is one dataclass of :mod:`sluice.metadata.documents`, with its one encode and decode;
the table below is the summary.

``cluster``                      {"cluster_id": str}
``brokers/<id>``                 {"broker_id", "host", "port", "rack", "started_ms", "inter_broker_port",
                                  "log_dir_failure" (if offline), "log_dir_low_space",
                                  "log_dir_free_bytes", "log_dir_size_bytes" (if low),
                                  "records_formats", "metadata_features" (what its code reads)}
``topics/<name>``                {"name", "topic_id", "internal", "config": {..},
                                  "replication_factor",
                                  "partitions": [{"replicas": [..], "leader": id,
                                                  "leader_epoch": n, "isr": [..]}],
                                  "states_in_records" (when set: the states change by records)}
``producer_id_block``            {"broker_id", "block_start", "block_end"}  (Kafka's
                                  /latest_producer_id_block: the last block handed out)
``controller``                   {"controller_id", "epoch", "live_brokers", "dead_brokers",
                                  "updated_ms", "isr_requests", "partition_changes"}  (written by the
                                  controller; leaders never re-admit a dead broker to an ISR, as in
                                  KIP-841)
``isr_requests/<id>``            {"broker_id", "requests": [{"topic", "topic_id", "partition",
                                  "leader_epoch", "partition_epoch", "base": [..], "isr": [..]}],
                                  "updated_ms"}  (written by broker <id> alone when the
                                  ``controller`` document says ``isr_requests``: the ISR changes it
                                  asks the controller for, Kafka's AlterPartition)
``partition_changes/<seq>``      {"seq", "topics": [{"topic", "topic_id", "partitions": {"<index>":
                                  <partition as in topics/>}}], "writer", "updated_ms"}  (<seq> zero-padded
                                  to 12 digits: one change record of partition states, created at the
                                  next number; written for a topic whose document says
                                  ``states_in_records``; sluice.metadata.topic_view composes them)
``topic_states/<name>``          {"name", "topic_id", "seq", "partitions": [..]}  (the controller's fold
                                  of the records up to seq; not watched)
``partition_changes_fold``       {"seq", "updated_ms"}  (records up to seq are folded and may be gone)
``replication_throttle``         {"rate": bytes/s, "resource": "namespace/name", "updated_ms"}  (written
                                  by the operator while a SluiceRebalance with
                                  spec.throttleBytesPerSecond runs, removed when it ends: the rate
                                  every broker's reassignment throttles use instead of their
                                  leader/follower.replication.throttled.rate)
``transactional_ids/<id>``       {"transactional_id", "resource": "namespace/name"}  (written by
                                  the operator for each TransactionalId resource; with
                                  transactional.id.declaration.required, only these ids may be used)
``acls/<id>``                    one ACL (sluice.acls.AclBinding.to_json); <id> is a digest of it, so
                                  the same ACL is one document (written by Admin.create_acls)
``quotas/users/<name>``          {"producer_byte_rate": n, "consumer_byte_rate": n} (either may be
                                  absent): Kafka's client quotas of one entity, here a user; also
                                  ``quotas/clients/<id>`` (a client id) and
                                  ``quotas/users/<name>/clients/<id>`` (a user's client id); a name
                                  is ``<default>`` for the default entity of its type, ``%`` and
                                  ``/`` escaped (written by Admin.alter_client_quotas,
                                  sluice.metadata.quota_store)
"""

CLUSTER = "cluster"
PID_BLOCK = "producer_id_block"
CONTROLLER = "controller"
REPLICATION_THROTTLE = "replication_throttle"
BROKERS = "brokers/"
TOPICS = "topics/"
ISR_REQUESTS = "isr_requests/"
PARTITION_CHANGES = "partition_changes/"
TOPIC_STATES = "topic_states/"
PARTITION_CHANGES_FOLD = "partition_changes_fold"
TRANSACTIONAL_IDS = "transactional_ids/"
ACLS = "acls/"
QUOTAS = "quotas/"


def broker(broker_id: int) -> str:
    return f"{BROKERS}{broker_id}"


def isr_requests(broker_id: int) -> str:
    return f"{ISR_REQUESTS}{broker_id}"


def topic(name: str) -> str:
    return f"{TOPICS}{name}"


def partition_changes(seq: int) -> str:
    return f"{PARTITION_CHANGES}{seq:012d}"


def topic_state(name: str) -> str:
    return f"{TOPIC_STATES}{name}"


def transactional_id(txn_id: str) -> str:
    return f"{TRANSACTIONAL_IDS}{txn_id}"


def acl(acl_id: str) -> str:
    return f"{ACLS}{acl_id}"
