"""Answers both coordinators give, as plain values (no protocol's messages).

The coordinators' own request and answer types are in ``txn/api`` and ``group/api``; what both
answer alike is here, where both may import it. As in :mod:`sluice.broker.data_path`, an error
travels as ``error_code`` and ``error_message`` (the Kafka code of the
:class:`~sluice.errors.SluiceError` that refused it, filled by :func:`sluice.broker.errors.answer`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.api.v1 import records_pb2 as pb


@dataclass(slots=True)
class PartitionAnswer:
    """One partition's answer (AddPartitionsToTxn, OffsetCommit, TxnOffsetCommit), in the order asked."""

    topic: str
    partition: int
    error_code: pb.ErrorCode = pb.NONE
    error_message: str = ""


@dataclass(slots=True)
class Outcome:
    """The answer of a call with nothing to return but whether it worked (AddOffsetsToTxn)."""

    error_code: pb.ErrorCode = pb.NONE
    error_message: str = ""
