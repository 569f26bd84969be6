"""Read a broker's stored partition logs without the broker: ``python -m sluice.broker.log.dump ROCKSDB_DIR``.

What the replica consistency check (:mod:`sluice.testing.replicas`) compares: for every partition
in the directory, its metadata (topic, HW checkpoint, leader epoch, log start) and one summary per
stored batch, in offset order. The summary is every header field of the batch as stored (base
offset, record count, partition leader epoch, producer id, epoch, base sequence, transactional,
control, timestamps, compression, CRC) and a SHA-256 of its record bytes, so two replicas' batches
compare equal exactly when they hold the same records under the same header.

Why a tool of the broker run as a subprocess: the key layout and column families are the
broker's (:mod:`sluice.broker.log.storage`, :mod:`sluice.broker.log.partition`), and the test
harness (``sluice.testing``) may not import ``sluice.broker`` (import-linter's layers). It opens
the database as a RocksDB *secondary* instance: that takes no lock, never writes the primary's
files, and reads the primary's write-ahead log as far as it is written, so it is safe on a
running broker (a consistent snapshot of what was written when it opened) and works the same on
a stopped or killed one. The secondary needs a scratch directory for its own info log; it is
created and removed here.

Output: one JSON document on stdout, ``{"partitions": [{"topic", "partition", "topic_id",
"high_watermark", "leader_epoch", "log_start_offset", "batches": [[...], ...]}]}``; each batch is
the list :data:`BATCH_FIELDS` names.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from typing import Any

from rocksdict import AccessType, Options, Rdict

from sluice.broker.log.storage import COLUMN_FAMILIES
from sluice.broker.log.stray import PREFIX_BYTES
from sluice.records import BATCH_SUMMARY_FIELDS, RecordBatch

BATCH_FIELDS = BATCH_SUMMARY_FIELDS  # the one list (sluice.records)


def _bytes(value: object) -> bytes:
    """A raw-mode key or value (rocksdict types them as any storable value)."""
    if not isinstance(value, bytes):
        raise TypeError(f"expected bytes from a raw-mode RocksDB, got {type(value).__name__}")
    return value


def batch_summary(raw: bytes) -> list[Any]:
    """The BATCH_FIELDS of one stored batch."""
    b = RecordBatch.FromString(raw)
    return [
        b.base_offset,
        b.record_count,
        b.partition_leader_epoch,
        b.producer_id,
        b.producer_epoch,
        b.base_sequence,
        b.transactional,
        b.control,
        b.first_timestamp,
        b.max_timestamp,
        int(b.compression),
        b.crc,
        hashlib.sha256(b.records).hexdigest(),
        int(b.records_format),
    ]


def dump(path: str) -> dict[str, Any]:
    """Every partition of the RocksDB at ``path`` with its batches (see the module docstring)."""
    scratch = tempfile.mkdtemp(prefix="sluice-dump-")
    try:
        db = Rdict(
            path,
            Options(raw_mode=True),
            column_families={cf: Options(raw_mode=True) for cf in COLUMN_FAMILIES},
            access_type=AccessType.secondary(scratch),
        )
        try:
            db.try_catch_up_with_primary()
            meta_cf, log_cf = db.get_column_family("partition_meta"), db.get_column_family("log")
            partitions: dict[bytes, dict[str, Any]] = {}
            for raw_key, value in meta_cf.items():
                key = _bytes(raw_key)
                if len(key) != PREFIX_BYTES:
                    continue  # not a partition record (the cluster id lives here too)
                meta = json.loads(_bytes(value))
                partitions[key] = {
                    "topic": meta["topic"],
                    "partition": meta["partition"],
                    "topic_id": meta["topic_id"],
                    "high_watermark": meta.get("high_watermark", 0),
                    "leader_epoch": meta["leader_epoch"],
                    "log_start_offset": meta["log_start_offset"],
                    "batches": [],
                }
            for raw_key, value in log_cf.items():  # keys sort by partition prefix, then offset
                entry = partitions.get(_bytes(raw_key)[:PREFIX_BYTES])
                if entry is not None:
                    entry["batches"].append(batch_summary(_bytes(value)))
            return {"partitions": list(partitions.values())}
        finally:
            db.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.broker.log.dump", description=__doc__.split("\n")[0])
    parser.add_argument("path", help="the broker's RocksDB directory (<data dir>/rocksdb)")
    args = parser.parse_args(argv)
    json.dump(dump(args.path), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
