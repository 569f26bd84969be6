"""Every TransactionalId's status from its coordinator, one round per interval for the namespace.

Topics and Coordinators have a Kopf timer per resource; TransactionalIds are the kind users create
by the thousand, one per producer instance. A timer per id every 5 s was, at 10,000 ids, 2,000
handler calls a second, each with a GET of the id's document, a LIST of the brokers and one
DescribeTransactions: more than an operator process can do, so the timers fell behind while the
API server took thousands of reads a second (issue 28; bench/txnids_scale.py measures it). Here a
round is, whatever the number of ids:

1. one paged LIST of the TransactionalIds (:data:`PAGE` per page);
2. one DescribeTransactions per coordinator, carrying all of its ids
   (:meth:`~sluice.client.admin.Admin.describe_transactions_each`, as Kafka's admin batches);
3. a status PATCH only for the resources whose status that changes (the same fields the change
   handler writes, :func:`~sluice.operator.resources.transaction_status`), at most
   ``patch_budget`` per round. The rest wait for a later round, which starts after the last one
   patched, so none starves. Each patch carries the resourceVersion the round listed: a resource
   changed since (its handler wrote conditions, say) is left for the next round rather than
   overwritten with what the round read.

An idle namespace costs one LIST and one DescribeTransactions per coordinator per round, and no
write. A resource not reconciled yet (no ``observedGeneration``) is left to its handler, which
writes the first whole status. Ids whose coordinator does not answer keep their status.

What stays with Kopf, per resource: creation, spec changes (declaring the id's document, fence and
abort operations) and deletion. Those are events, one per change, at any scale. The drift repair
the timer did on every tick (a document deleted behind the operator's back declared again) is
``redeclare``, called with the listed resources every ``declare_every`` rounds: one LIST of the
documents, and a write only for what drifted.

Only the replica holding the controller's Lease runs rounds (``may_act``), as the certificate loop.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sluice import errors
from sluice.client.admin import Admin, TransactionDescription
from sluice.metadata.kubernetes import GROUP, VERSION, api_status
from sluice.operator.resources import transaction_status

log = logging.getLogger("sluice.operator")

PLURAL = "transactionalids"
PAGE = 500  # objects per LIST page
DEFAULT_PATCH_BUDGET = 50  # status PATCHes per round: 10 a second at the default 5 s interval


def description_fields(d: TransactionDescription) -> dict[str, Any]:
    """A coordinator's description as :func:`transaction_status` takes it (partitions as "topic-n")."""
    described = dataclasses.asdict(d)
    described["partitions"] = [f"{tp.topic}-{tp.partition}" for tp in d.partitions]
    return described


def status_changes(
    item: Mapping[str, Any], answer: TransactionDescription | errors.SluiceError | None, now_ms: int
) -> dict[str, Any] | None:
    """The status fields of the TransactionalId ``item`` that its coordinator's ``answer`` changes
    ({} for none); None when there is no answer to go by (the coordinator did not answer)."""
    if isinstance(answer, errors.TransactionalIdNotFoundError):
        described = None  # never used
    elif answer is None or isinstance(answer, errors.SluiceError):
        return None
    else:
        described = description_fields(answer)
    meta, spec, status = item["metadata"], item.get("spec") or {}, item.get("status") or {}
    new = transaction_status(
        described, status.get("conditions") or [], spec.get("transactionTimeoutMs"), now_ms, meta.get("generation")
    )
    return {k: v for k, v in new.items() if status.get(k) != v}


@dataclasses.dataclass
class Round:
    """What one round did (logged, and returned for tests and the benchmark)."""

    listed: int = 0
    unanswered: int = 0  # ids whose coordinator gave no answer: their status stays
    changed: int = 0  # resources whose status the answers change
    patched: int = 0
    conflicts: int = 0  # changed since the LIST: left for the next round
    redeclared: int = 0  # documents declared again (the drift repair)
    seconds: float = 0.0


class TransactionalIdStatuses:
    """The status rounds (module docstring): :meth:`run_round` once, or :meth:`start` a thread that
    runs one every ``interval_s`` while ``may_act()``."""

    def __init__(
        self,
        custom: Any,
        namespace: str,
        admin: Callable[[], Admin],
        *,
        interval_s: float,
        patch_budget: int = DEFAULT_PATCH_BUDGET,
        may_act: Callable[[], bool] = lambda: True,
        redeclare: Callable[[list[Mapping[str, Any]]], int] | None = None,
        declare_every: int = 12,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.custom = custom
        self.namespace = namespace
        self.admin = admin
        self.interval_s = interval_s
        self.patch_budget = patch_budget
        self.may_act = may_act
        self.clock = clock
        self.redeclare = redeclare
        self.declare_every = max(1, declare_every)
        self._rounds = 0
        self._cursor = ""  # the last name patched: the next round's patches start after it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread -------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="transactional-id-statuses", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        # Rounds start every interval_s (a round's own time counts in it: at 10,000 ids a round took
        # 2.6 to 4.4 s here, and waiting the whole interval after it made the period 8.7 s, not 5),
        # with at least a fifth of the interval between two, should rounds take longer than that.
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            started = time.monotonic()
            if self.may_act():
                self._round_logged()
            next_at = max(started + self.interval_s, time.monotonic() + self.interval_s / 5)

    def _round_logged(self) -> None:
        try:
            done = self.run_round()
        except Exception as exc:  # the API server or every broker away: the next round tries again
            log.warning("TransactionalId status round failed: %s", exc)
            return
        log.log(
            logging.INFO if done.changed or done.conflicts or done.redeclared else logging.DEBUG,
            "TransactionalId status round: %d listed, %d changed, %d patched, %d unanswered, "
            "%d conflicts, %d redeclared in %.2f s",
            done.listed,
            done.changed,
            done.patched,
            done.unanswered,
            done.conflicts,
            done.redeclared,
            done.seconds,
        )

    # -- one round --------------------------------------------------------------------------------

    def run_round(self) -> Round:
        started = time.monotonic()
        done = Round()
        by_id: dict[str, list[Mapping[str, Any]]] = {}
        for item in self._list():
            done.listed += 1
            if "observedGeneration" not in (item.get("status") or {}):
                continue  # not reconciled yet: its handler writes the first whole status (and declares)
            txn_id = (item.get("spec") or {}).get("transactionalId")
            if txn_id:
                by_id.setdefault(str(txn_id), []).append(item)
        if self.redeclare is not None and self._rounds % self.declare_every == 0:
            done.redeclared = self.redeclare([item for items in by_id.values() for item in items])
        self._rounds += 1
        answers: dict[str, TransactionDescription | errors.SluiceError] = {}
        if by_id:
            answers = self.admin().describe_transactions_each(list(by_id), timeout=max(1.0, self.interval_s))
        now_ms = int(self.clock() * 1000)
        changed: list[tuple[str, Mapping[str, Any], dict[str, Any]]] = []
        for txn_id, items in by_id.items():
            for item in items:
                change = status_changes(item, answers.get(txn_id), now_ms)
                if change is None:
                    done.unanswered += 1
                elif change:
                    changed.append((item["metadata"]["name"], item, change))
        done.changed = len(changed)
        changed.sort(key=lambda c: c[0])
        order = [c for c in changed if c[0] > self._cursor] + [c for c in changed if c[0] <= self._cursor]
        for name, item, change in order[: self.patch_budget]:
            body = {"metadata": {"resourceVersion": item["metadata"]["resourceVersion"]}, "status": change}
            try:
                self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, name, body)
                done.patched += 1
            except Exception as exc:
                if api_status(exc) == 409:
                    done.conflicts += 1  # changed since the LIST: the next round reads it again
                elif api_status(exc) != 404:  # 404: deleted meanwhile
                    raise
            self._cursor = name
        if len(order) <= self.patch_budget:
            self._cursor = ""  # every change made: the next round starts from the first name again
        done.seconds = round(time.monotonic() - started, 3)
        return done

    def _list(self) -> Iterator[Mapping[str, Any]]:
        token = ""
        for _page in range(100_000):  # bounded: PAGE x 100,000 objects
            kwargs: dict[str, Any] = {"limit": PAGE}
            if token:
                kwargs["_continue"] = token
            found = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, **kwargs)
            yield from found.get("items") or []
            token = (found.get("metadata") or {}).get("continue") or ""
            if not token:
                return
