"""What the handlers share at run time: settings, the metadata store, an admin client, the controller.

One :class:`OperatorRuntime` per operator process, made by the start-up
handler (:mod:`sluice.operator.handlers.lifecycle`) from the
:class:`~sluice.operator.settings.OperatorSettings` and kept in Kopf's
``memo``, which Kopf hands to every handler. Handlers get it with
:func:`runtime_of`; tests build one over a LocalCluster's store and call the
handlers' reconcile functions with it directly.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import kopf

from sluice.client.admin import Admin
from sluice.metadata import documents, keys, open_store
from sluice.metadata.documents import BrokerDocument
from sluice.metadata.kubernetes import GROUP, VERSION, api_client
from sluice.metadata.store import MetadataStore
from sluice.operator import metrics
from sluice.operator.controller.kubernetes import KubernetesController
from sluice.operator.handlers.status import drop_unchanged_status
from sluice.operator.settings import OperatorSettings

log = logging.getLogger("sluice.operator")

FINALIZER = "sluice.dev/finalizer"
ADMIN_TIMEOUT_S = 15.0
ADDRESSES_TTL_S = 2.0  # how long the admin client's broker addresses are reused before a new LIST
HANDLER_BACKOFF_S = 3.0  # a failed handler is retried this soon (Kopf's default is 60 s)


def register_kind(
    registry: kopf.OperatorRegistry,
    plural: str,
    *,
    changed: Callable[..., Any],
    timer: Callable[..., Any] | None,
    interval_s: float,
    deleted: Callable[..., Any] | None = None,
) -> None:
    """Register one kind's handlers the way every kind wants them: ``changed`` on resume, create
    and update (retried after HANDLER_BACKOFF_S), ``timer`` every ``interval_s`` (drift repair or
    status; None for a kind whose periodic work is one loop for all its resources, as
    TransactionalIds), and ``deleted`` behind the finalizer when given.

    A kind without ``deleted`` gets no finalizer: deleting such a resource has nothing to clean
    up, so nothing should wait for the operator. Kopf puts its finalizer on every resource that
    has a timer (to stop the timer before the object goes); here the timer of such a kind is
    registered without that demand, and Kopf simply cancels it when the object is gone. Without
    this, `helm uninstall` hung on the chart's Coordinators: Helm deletes them and the operator
    together, and a finalizer whose operator is gone is never removed. Kopf also drops the
    finalizer from objects an older operator put it on, on their next event.
    """
    kind = metrics.kind_of(plural)  # every call counted and timed (sluice.operator.metrics)
    changed = metrics.instrument(kind, _sends_only_changes(changed))
    for on in (kopf.on.resume, kopf.on.create, kopf.on.update):
        on(GROUP, VERSION, plural, backoff=HANDLER_BACKOFF_S, registry=registry)(changed)
    if timer is not None:
        timer = metrics.instrument(kind, _sends_only_changes(timer), drift_check=True)
        kopf.timer(GROUP, VERSION, plural, interval=interval_s, initial_delay=interval_s, registry=registry)(timer)
    if deleted is not None:
        deleted = metrics.instrument(kind, deleted)
        kopf.on.delete(GROUP, VERSION, plural, backoff=HANDLER_BACKOFF_S, registry=registry)(deleted)
    elif timer is not None:
        _timers_hold_no_deletion(registry, plural)


def _sends_only_changes(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` with the status fields it set to what the resource has already left out of its patch
    (:func:`~sluice.operator.handlers.status.drop_unchanged_status`), so an idle resource costs no PATCH."""

    @functools.wraps(handler)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        finally:
            patch, body = kwargs.get("patch"), kwargs.get("body")
            if isinstance(patch, kopf.Patch) and body is not None:
                drop_unchanged_status(patch, body)

    return wrapped


def _timers_hold_no_deletion(registry: kopf.OperatorRegistry, plural: str) -> None:
    """Mark the timers of ``plural`` as not needing a finalizer (see :func:`register_kind`).

    ``kopf.timer`` has no option for it, so its handler objects (frozen dataclasses in the
    registry's spawning part) are replaced by copies with ``requires_finalizer=False``, which is
    the flag Kopf reads (``SpawningRegistry.requires_finalizer``) when it decides to add one.
    """

    def ours(handler: Any) -> bool:
        selector = handler.selector
        return selector is not None and selector.group == GROUP and plural in (selector.plural, selector.any_name)

    handlers: list[Any] = registry._spawning._handlers
    for i, handler in enumerate(handlers):
        if ours(handler) and handler.requires_finalizer:
            handlers[i] = dataclasses.replace(handler, requires_finalizer=False)
    if not any(ours(h) for h in handlers) or any(ours(h) and h.requires_finalizer for h in handlers):
        raise RuntimeError(f"could not register the {plural} timers without a finalizer (Kopf changed?)")


class OperatorRuntime:
    """The store, an admin client to the brokers and the controller, shared by every handler."""

    def __init__(
        self,
        settings: OperatorSettings,
        store: MetadataStore | None = None,
        controller: KubernetesController | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.controller = controller
        self._admin: tuple[tuple[tuple[str, ...], bytes | None], Admin] | None = None
        self._addresses: tuple[float, tuple[str, ...]] = (0.0, ())  # (read at, monotonic s; addresses)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, settings: OperatorSettings) -> OperatorRuntime:
        """Open the store and start the controller's threads."""
        store = open_store(settings.metadata_url)
        session_timeout_s, health_port = settings.health_checks()
        controller = KubernetesController(
            store,
            api_client(settings.kubeconfig),
            settings.namespace,
            broker_selector=settings.broker_selector,
            grace_s=settings.failover_grace_s,
            expected_brokers=settings.expected_brokers,
            statefulset=settings.broker_statefulset,
            preferred_leader_delay_s=settings.preferred_leader_delay_s,
            preferred_leader_hold_s=settings.preferred_leader_hold_s,
            identity=settings.identity,
            session_timeout_s=session_timeout_s,
            health_port=health_port,
        )
        controller.start()
        log.info("operator for namespace %s, metadata %s", settings.namespace, settings.metadata_url)
        return cls(settings, store, controller)

    def close(self) -> None:
        if self.controller is not None:
            self.controller.stop()
        with self._lock:
            if self._admin is not None:
                self._admin[1].close()
                self._admin = None
        if self.store is not None:
            self.store.close()

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    @property
    def meta(self) -> MetadataStore:
        if self.store is None:
            raise kopf.TemporaryError("the operator is starting", delay=1)
        return self.store

    def brokers(self) -> list[BrokerDocument]:
        """Registered brokers, by id."""
        found = documents.list_documents(self.meta, keys.BROKERS, BrokerDocument)
        return sorted((d.value for d in found), key=lambda b: b.broker_id)

    def custom(self) -> Any:
        """The API server's CustomObjectsApi (the controller's client)."""
        if self.controller is None:
            raise kopf.TemporaryError("the operator is starting", delay=1)
        return self.controller.custom

    def core(self) -> Any:
        """The API server's CoreV1Api (the controller's client)."""
        if self.controller is None:
            raise kopf.TemporaryError("the operator is starting", delay=1)
        return self.controller.core

    def known_brokers(self) -> int:
        """The brokers a replication factor is checked against: registered ones, or the expected count if larger."""
        expected = self.controller.expected() if self.controller is not None else self.settings.expected_brokers
        return max(len(self.brokers()), expected)

    def _broker_addresses(self) -> tuple[str, ...]:
        """The registered brokers' addresses, read again at most every ADDRESSES_TTL_S: every
        handler call asks for the admin client, and a LIST of ``brokers/`` each time was one API
        read per handler call (thousands a second with TransactionalId timers at 10,000 ids). The
        client finds the cluster's brokers itself from any one of them."""
        now = time.monotonic()
        with self._lock:
            read_at, addresses = self._addresses
        if addresses and now - read_at < ADDRESSES_TTL_S:
            return addresses
        addresses = tuple(b.address for b in self.brokers())
        with self._lock:
            self._addresses = (now, addresses)
        return addresses

    def admin(self) -> Admin:
        """An admin client to the registered brokers (made again when they change, or when the
        brokers' CA file changed: a client reads it once, and a CA rotation replaces it)."""
        addresses = self._broker_addresses()
        if not addresses:
            raise kopf.TemporaryError("no broker has registered yet", delay=5)
        ca = self._broker_ca()
        with self._lock:
            if self._admin is None or self._admin[0] != (addresses, ca):
                if self._admin is not None:
                    self._admin[1].close()
                self._admin = (
                    (addresses, ca),
                    Admin(
                        list(addresses),
                        request_timeout_ms=10_000,
                        client_id="sluice-operator",
                        **self.settings.broker_security(),
                    ),
                )
            return self._admin[1]

    def _broker_ca(self) -> bytes | None:
        """The brokers' CA bundle as the operator's file holds it now, with its own client certificate
        and key when it has them (None: plaintext brokers): a changed file makes a new Admin.

        A missing file is a TemporaryError: with operator-managed certificates the Secret it is
        projected from is made by this operator, and the kubelet fills the volume a little later."""
        s = self.settings
        paths = [p for p in (s.broker_ca_file, s.broker_cert_file, s.broker_key_file) if p]
        if not s.broker_ca_file:
            return None
        out = b""
        for path in paths:
            try:
                with open(path, "rb") as f:
                    out += f.read()
            except OSError as exc:
                message = f"the brokers' TLS file {path} cannot be read yet: {exc.strerror}"
                raise kopf.TemporaryError(message, delay=10) from None
        return out


def runtime_of(memo: Any) -> OperatorRuntime:
    """The runtime the start-up handler put in Kopf's memo (TemporaryError while it is not there yet)."""
    runtime = getattr(memo, "runtime", None)
    if not isinstance(runtime, OperatorRuntime):
        raise kopf.TemporaryError("the operator is starting", delay=1)
    return runtime
