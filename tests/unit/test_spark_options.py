"""Option parsing of the "sluice" Spark source: Kafka-source names, defaults, and clear errors."""

from __future__ import annotations

import pytest

from sluice.spark.options import EARLIEST, LATEST, SluiceOptionError, parse_read_options

B = {"bootstrap.servers": "127.0.0.1:9092"}


def test_defaults_follow_the_kafka_source() -> None:
    batch = parse_read_options({**B, "subscribe": "a, b,a"}, streaming=False)
    assert batch.subscribe == ("a", "b")
    assert (batch.starting.kind, batch.ending.kind) == ("earliest", "latest")
    assert batch.read_committed and batch.fail_on_data_loss and not batch.include_headers
    stream = parse_read_options({**B, "subscribe": "a"}, streaming=True)
    assert stream.starting.kind == "latest"
    kafka_names = parse_read_options(
        {"kafka.bootstrap.servers": "h:1", "assign": '{"a":[1,0,1]}', "kafka.isolation.level": "read_uncommitted"},
        streaming=False,
    )
    assert kafka_names.assign == {"a": (0, 1)} and not kafka_names.read_committed


def test_offsets_json() -> None:
    o = parse_read_options(
        {**B, "subscribe": "a", "startingOffsets": '{"a":{"0":5,"1":-2}}', "endingOffsets": '{"a":{"0":-1,"1":9}}'},
        streaming=False,
    )
    assert o.starting.for_partition("a", 0) == 5 and o.starting.for_partition("a", 1) == EARLIEST
    assert o.ending.for_partition("a", 0) == LATEST and o.ending.for_partition("a", 1) == 9


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"subscribe": "a"}, False, "'bootstrap.servers' is required"),
        ({**B}, False, "exactly one of 'subscribe', 'subscribePattern' and 'assign'"),
        ({**B, "subscribe": "a", "subscribePattern": "a.*"}, False, "(got subscribe, subscribePattern)"),
        ({**B, "subscribePattern": "a("}, False, "not a valid regular expression"),
        ({**B, "assign": '{"a":[]}'}, False, "non-empty list of partitions"),
        ({**B, "assign": '{"a":["x"]}'}, False, "'x' in topic 'a' is not a partition number"),
        ({**B, "assign": "[1]"}, False, "must be a JSON object"),
        ({**B, "subscribe": "a", "startingOffsets": "latest"}, False, "cannot be 'latest' here"),
        ({**B, "subscribe": "a", "endingOffsets": "earliest"}, False, "cannot be 'earliest' here"),
        ({**B, "subscribe": "a", "startingOffsets": '{"a":{"0":-1}}'}, False, "offset -1 of a-0 is not allowed"),
        ({**B, "subscribe": "a", "endingOffsets": '{"a":{"0":-2}}'}, False, "offset -2 of a-0 is not allowed"),
        ({**B, "subscribe": "a", "startingOffsets": '{"a":{"zero":1}}'}, False, "partition 'zero'"),
        ({**B, "subscribe": "a", "startingOffsets": "{"}, False, "is not valid JSON"),
        ({**B, "subscribe": "a", "startingOffsets": "first"}, False, "must be 'earliest', 'latest' or JSON"),
        ({**B, "assign": '{"a":[0,1]}', "startingOffsets": '{"a":{"0":1}}'}, False, "missing: [('a', 1)]"),
        ({**B, "subscribe": "a", "minPartitions": "0"}, False, "'minPartitions' must be a positive integer"),
        ({**B, "subscribe": "a", "failOnDataLoss": "yes"}, False, "'failOnDataLoss' must be 'true' or 'false'"),
        ({**B, "subscribe": "a", "isolationLevel": "snapshot"}, False, "'isolationLevel' must be"),
        ({**B, "subscribe": "a", "maxOffsetsPerTrigger": "10"}, False, "only for streaming queries"),
        ({**B, "subscribe": "a", "endingOffsets": "latest"}, True, "only for batch queries"),
        ({**B, "subscribe": "a", "startingOffset": "earliest"}, False, "unknown option(s) startingoffset"),
        ({**B, "subscribe": "a", "path": "/x"}, False, "takes no path"),
    ],
)
def test_bad_options_are_refused_clearly(options: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(SluiceOptionError) as info:
        parse_read_options(options, streaming=streaming)
    assert message in str(info.value)
