"""The one error table (sluice.errors): one class per Kafka error code, used by broker and client."""

from __future__ import annotations

import pytest

from sluice import errors
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.errors import answer


def test_every_wire_code_has_exactly_one_class() -> None:
    codes = [cls.code for cls in errors.ERRORS]
    assert len(codes) == len(set(codes))
    assert set(codes) == {code for _name, code in pb.ErrorCode.items() if code != pb.NONE}
    for cls in errors.ERRORS:
        assert errors.error_class(cls.code) is cls
        assert cls.__module__ == "sluice.errors" and cls.__doc__
        assert errors.error_for(cls.code, "m").code_name == pb.ErrorCode.Name(cls.code)


@pytest.mark.parametrize(
    ("code", "cls", "retriable"),
    [
        (pb.NOT_COORDINATOR, errors.NotCoordinatorError, True),
        (pb.COORDINATOR_LOAD_IN_PROGRESS, errors.CoordinatorLoadInProgressError, True),
        (pb.NOT_LEADER_OR_FOLLOWER, errors.NotLeaderOrFollowerError, True),
        (pb.CONCURRENT_TRANSACTIONS, errors.ConcurrentTransactionsError, True),
        (pb.PRODUCER_FENCED, errors.ProducerFencedError, False),
        (pb.INVALID_TXN_STATE, errors.InvalidTxnStateError, False),
        (pb.INVALID_CONFIG, errors.InvalidConfigError, False),
    ],
)
def test_codes_classes_and_retriable_flags(code: int, cls: type[errors.SluiceError], retriable: bool) -> None:
    exc = errors.error_for(code, "why")
    assert type(exc) is cls and exc.retriable is retriable and exc.message == "why"
    assert errors.is_retriable(code) is retriable
    with pytest.raises(cls):
        errors.check(code, "why")


def test_client_side_errors_and_unknown_codes() -> None:
    assert errors.IllegalStateError("x").code_name == "CLIENT_ERROR"
    assert errors.KafkaTimeoutError().retriable
    assert type(errors.error_for(12345, "?")) is errors.UnknownServerError
    assert not errors.is_retriable(pb.NONE)
    errors.check(pb.NONE)


def test_the_broker_answers_a_refusal_with_its_code_and_message() -> None:
    out = bpb.EndTxnResponse()
    answer(out, errors.ConcurrentTransactionsError("retry later"))
    assert (out.error_code, out.error_message) == (pb.CONCURRENT_TRANSACTIONS, "retry later")
