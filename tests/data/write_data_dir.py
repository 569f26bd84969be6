"""Write the small data directory that tests/integration/test_data_dir_upgrade.py opens with newer code.

Run from a checkout of the commit whose format the fixture should hold (with its venv and the dev
extra), then pack it without what is rewritten at start (certificates, logs, RocksDB's LOG/LOCK):

    python tests/data/write_data_dir.py /tmp/d
    tar -C /tmp/d --exclude=./tls --exclude=./controller.log --exclude=./broker-0.log \
        --exclude=LOG --exclude=LOCK -czf tests/data/data-dir-<commit>.tgz .

What it writes, on one broker, topic "old" (one partition): 3 records from Sluice's client in a
committed transaction (offsets 0-2, marker 3), a transaction aborted before its record was sent
(nothing written), 3 records from kafka-python with headers and timestamps (4-6), and group
"old-group" committed at offset 4.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kafka import KafkaProducer

from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster


def main(out: Path) -> None:
    with LocalCluster(brokers=1, data_dir=out, kafka_listener=True) as c:
        admin = Admin(bootstrap_servers=c.bootstrap_servers)
        admin.create_topic("old", partitions=1, replication_factor=1)
        admin.close()
        p = Producer(bootstrap_servers=c.bootstrap_servers, transactional_id="old-txn")
        p.init_transactions()
        p.begin_transaction()
        for i in range(3):
            p.send("old", key=f"k{i}".encode(), value=f"grpc-{i}".encode(), partition=0, headers=[("h", b"g")])
        p.commit_transaction()
        p.begin_transaction()
        p.send("old", value=b"aborted", partition=0)
        p.abort_transaction()
        p.close()
        kp = KafkaProducer(bootstrap_servers=c.kafka_bootstrap_servers, linger_ms=50)
        for i in range(3):
            kp.send("old", key=f"kk{i}".encode(), value=f"kafka-{i}".encode(), partition=0,
                    headers=[("h", b"k")], timestamp_ms=1_700_000_000_000 + i)  # fmt: skip
        kp.flush()
        kp.close()
        consumer = Consumer(bootstrap_servers=c.bootstrap_servers, group_id="old-group")
        consumer.assign([TopicPartition("old", 0)])
        consumer.commit(offsets={TopicPartition("old", 0): 4})
        consumer.close()
    print("written", out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
