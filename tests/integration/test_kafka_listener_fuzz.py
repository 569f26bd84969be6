"""Malformed Kafka frames for every API key: the broker answers or closes, stays up, loses nothing.

Thousands of frames (every API key of kafka-clients 4.3.1, versions in and out of range, random
and mutated bodies, truncations) go to a real broker's Kafka listener after records were
acknowledged over gRPC; afterwards the broker still answers both protocols and every
acknowledged record reads back unchanged. Bounded: a fixed count of frames, a timeout on every
read.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from pathlib import Path

from sluice.broker.kafka.handlers import build_handlers
from sluice.broker.kafka_wire.codec import encode
from sluice.broker.kafka_wire.messages import APIS
from sluice.broker.kafka_wire.messages.metadata_request import MetadataRequest, MetadataRequestTopic
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster

from ..unit.test_kafka_codec import sample
from .helpers import read_topic

FRAMES_PER_KEY = 40
VALID_PER_VERSION = 3  # well-formed requests with random field values, for every served API and version
READ_TIMEOUT_S = 30.0


def header(key: int, version: int, correlation_id: int, flexible: bool) -> bytes:
    out = struct.pack(">hhi", key, version, correlation_id) + struct.pack(">h", 4) + b"fuzz"
    return out + (b"\x00" if flexible else b"")


def frames_for(rng: random.Random, key: int) -> list[bytes]:
    api = APIS[key]
    out: list[bytes] = []
    for i in range(FRAMES_PER_KEY):
        version = rng.choice([api.valid.lo, api.valid.hi, rng.randint(-3, api.valid.hi + 5), 0x7FFF])
        flexible = version in api.flexible or version > api.valid.hi
        body = rng.randbytes(rng.choice([0, 1, 3, 17, 200]))
        if key == 3 and i % 4 == 0:  # a valid Metadata body, then mutated
            version = rng.randint(0, 13)
            flexible = version in api.flexible
            good = encode(MetadataRequest(topics=[MetadataRequestTopic(name="fuzz")]), version)
            cut = rng.randint(0, len(good))
            body = good[:cut] + rng.randbytes(rng.randint(0, 3))
        frame = header(key, version, i, flexible) + body
        size = len(frame)
        if i % 10 == 9:
            size = rng.choice([-1, 0, 1 << 30, len(frame) + 50])  # lies about its size
        out.append(struct.pack(">i", size) + frame)
    return out


def valid_frames(rng: random.Random) -> list[bytes]:
    """Decodable requests with random values (names, ids, counts, epochs) for every served API version.

    They reach the handlers: each must answer with a Kafka error or refuse, never fail unguarded.
    """
    out = []
    for key, handler in sorted(build_handlers().items()):
        api = APIS[key]
        for version in range(handler.versions.lo, handler.versions.hi + 1):
            for n in range(VALID_PER_VERSION):
                body = encode(sample(rng, api.request, version), version)
                frame = header(key, version, n, version in api.flexible) + body
                out.append(struct.pack(">i", len(frame)) + frame)
    return out


def answered_or_closed(sock: socket.socket) -> str:
    sock.settimeout(READ_TIMEOUT_S)
    try:
        head = sock.recv(4)
    except ConnectionResetError:
        return "closed"
    if not head:
        return "closed"
    while len(head) < 4:
        more = sock.recv(4 - len(head))
        assert more, "closed inside a response size"
        head += more
    (size,) = struct.unpack(">i", head)
    left = size
    while left:
        chunk = sock.recv(min(left, 65536))
        assert chunk, "closed inside a response"
        left -= len(chunk)
    return "answered"


def test_thousands_of_malformed_frames_for_every_api_key(tmp_path: Path) -> None:
    topic = "kafka-fuzz"
    with LocalCluster(brokers=1, data_dir=tmp_path / "cluster", kafka_listener=True) as cluster:
        Admin(bootstrap_servers=cluster.bootstrap_servers).create_topic(topic, partitions=2, replication_factor=1)
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=2)
        sent = [(f"k{i}".encode(), f"value-{i}".encode()) for i in range(200)]
        for future in [producer.send(topic, key=k, value=v) for k, v in sent]:
            future.result(timeout=60)
        producer.close()

        host, _, port = cluster.kafka_bootstrap_servers.rpartition(":")
        rng = random.Random(18)
        outcomes = {"answered": 0, "closed": 0}
        total = 0
        started = time.monotonic()
        sock = socket.create_connection((host, int(port)), timeout=READ_TIMEOUT_S)
        every = [frame for key in sorted(APIS) for frame in frames_for(rng, key)] + valid_frames(rng)
        for frame in every:
            total += 1
            try:
                sock.sendall(frame)
                if struct.unpack(">i", frame[:4])[0] != len(frame) - 4:
                    # a frame that lies about its size: the broker waits for the rest (as Kafka does),
                    # so the client ends it, as a client that crashed mid-frame would
                    sock.shutdown(socket.SHUT_WR)
                outcome = answered_or_closed(sock)
            except (BrokenPipeError, ConnectionResetError):
                outcome = "closed"
            outcomes[outcome] += 1
            if outcome == "closed":
                sock.close()
                sock = socket.create_connection((host, int(port)), timeout=READ_TIMEOUT_S)
        sock.close()
        elapsed = time.monotonic() - started
        assert total >= 3000, total
        assert outcomes["closed"] > 0 and outcomes["answered"] > 100, outcomes

        # still up: one process, answering both protocols, with every acknowledged record intact
        assert cluster.brokers[0].is_alive()
        got = read_topic(cluster.bootstrap_servers, topic)
        assert sorted((k, v) for _, _, k, v in got) == sorted(sent)
        with socket.create_connection((host, int(port)), timeout=READ_TIMEOUT_S) as check:
            good = header(18, 3, 1, True) + b"\x02a\x021\x00"  # ApiVersions v3
            check.sendall(struct.pack(">i", len(good)) + good)
            assert answered_or_closed(check) == "answered"
        log = cluster.brokers[0].log_path.read_text(errors="replace")
        assert "Traceback" not in log, "an input reached a handler or the codec unguarded"
        print(f"{total} frames in {elapsed:.1f} s: {outcomes}")
