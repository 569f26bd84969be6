"""The Kubernetes MetadataStore: documents as custom resources, compare-and-set on resourceVersion.

In Kubernetes the API server (and etcd behind it) is the cluster's ZooKeeper.
Every document of :mod:`sluice.metadata.keys` is one ``MetadataDocument``
object (``sluice.dev/v1alpha1``, internal, manifests/crds/) in the cluster's
namespace: ``spec.key`` is the key, ``spec.value`` the JSON text. Why one
internal kind rather than writing ``topics/<name>`` straight into the
``Topic`` resource's status:

* Not every topic has a Topic object. Topics created through the Kafka-style
  admin API (CreateTopics) and the internal topics (``__transaction_state``:
  underscores are not allowed in object names) need a document too, and
  brokers create them without the operator.
* Two writers on one object would conflict for no reason: a user editing a
  Topic's spec changes its resourceVersion, and every leader's ISR
  compare-and-set would fail and retry.
* One kind keeps the store a plain key-value store with one watch, so the
  broker's code is the same over SQLite and Kubernetes.

The Topic's status is then what the operator projects from the document
(partitions, leaders, ISR, epochs): the document is the truth, the status
its readable copy. See docs/architecture.md.

Mapping of the store's operations:

* ``version`` and ``revision`` are both the object's ``resourceVersion``.
  Kubernetes calls it opaque, but it is etcd's store-wide modification
  revision, which is exactly the store-wide, increasing revision the
  protocol asks for; it is read as an integer here and nowhere else.
* ``get``/``list`` are GET/LIST without a resourceVersion: quorum reads
  from etcd, never a stale cache, so a read-modify-write loop converges.
* ``compare_and_set`` is a create (expected None: AlreadyExists means
  VersionConflict) or a replace carrying ``metadata.resourceVersion``
  (409 Conflict or 404 mean VersionConflict). ``delete`` carries a
  resourceVersion precondition.
* ``changes_since`` reads a local cache kept by a watch (an informer): one
  LIST, then a watch from its resourceVersion with bookmarks. The watch leaves
  out ``topic_states/`` (``UNWATCHED_FAMILIES``): readers LIST those. A watch
  delivers events in revision order, so once the cache has seen revision
  ``r`` it holds every change up to ``r``; deletions stay in the cache as
  tombstones (value None), as they do in the SQLite store. When the watch
  expires (410 Gone) the cache is rebuilt from a new LIST, and documents
  that vanished meanwhile become tombstones at the LIST's revision, so a
  poller never misses a deletion. Read-your-writes: after this process
  writes, ``changes_since`` waits (bounded) until the watch has delivered
  that write, so a broker that creates a topic sees it on its next refresh,
  as with SQLite.

Object names: keys may hold characters object names may not (``/``, ``_``,
upper case), so the name is a readable slug of the key plus a hash of it
(``topics-orders-1a2b3c4d5e``); the label ``sluice.dev/prefix`` holds the
part before the first ``/`` so ``list("topics/")`` is a label-selected LIST.

URL: ``kubernetes://NAMESPACE[?kubeconfig=PATH&context=NAME]``. Without a
namespace (``kubernetes://``), the pod's own namespace. Credentials: the
pod's service account inside a cluster, else the kubeconfig (``$KUBECONFIG``
or ~/.kube/config, or the ``kubeconfig`` parameter).
"""

from __future__ import annotations

import bisect
import builtins
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from sluice.metadata.store import Document, StoreUnavailable, VersionConflict

log = logging.getLogger(__name__)

GROUP = "sluice.dev"
VERSION = "v1alpha1"
PLURAL = "metadatadocuments"
KIND = "MetadataDocument"
PREFIX_LABEL = "sluice.dev/prefix"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
READ_YOUR_WRITES_WAIT_S = 5.0
WATCH_TIMEOUT_S = 30  # server-side end of one watch request; it is then renewed from where it was
# (connect, read) deadline of one get/list/write: an API server cut off by a firewall drops packets,
# and without a deadline the call (and the broker's event loop it runs on) would hang for minutes
REQUEST_TIMEOUT_S = (3.0, 10.0)
# after a call found the API server unreachable, calls fail at once for this long: a cut-off broker
# would otherwise spend a connect deadline per call (per partition whose ISR it wants to change)
FAIL_FAST_S = 5.0
# The watch (and its re-lists) leaves out the families no watcher needs as they change: the folded
# partition states (``topic_states/``: a fold rewrites many and changes none, sluice.metadata.topic_view),
# which readers LIST when they need them. So changes_since never returns them over Kubernetes.
UNWATCHED_FAMILIES = ("topic_states",)
WATCH_SELECTOR = ",".join(f"{PREFIX_LABEL}!={family}" for family in UNWATCHED_FAMILIES)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class KubernetesStoreError(Exception):
    """The store cannot be opened (bad URL, no credentials, CRD missing)."""


def object_name(key: str) -> str:
    """A valid object name for ``key``: a readable slug plus 10 hex digits of its sha256."""
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")[:200].strip("-") or "doc"
    return f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def prefix_label(key: str) -> str | None:
    """The value of the ``sluice.dev/prefix`` label for ``key`` (None when not a valid label value)."""
    head = key.split("/", 1)[0] if "/" in key else ""
    return head if len(head) <= 63 and _LABEL_VALUE.match(head) else None


def parse_url(url: str) -> tuple[str, dict[str, str]]:
    """``kubernetes://NAMESPACE?kubeconfig=..&context=..`` -> (namespace, options)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "kubernetes":
        raise KubernetesStoreError(f"not a kubernetes:// URL: {url!r}")
    options = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query).items()}
    unknown = set(options) - {"kubeconfig", "context"}
    if unknown:
        raise KubernetesStoreError(f"unknown option(s) {sorted(unknown)} in {url!r}: use kubeconfig, context")
    namespace = parsed.netloc or os.environ.get("POD_NAMESPACE", "")
    if not namespace and os.path.exists(SERVICE_ACCOUNT_NAMESPACE):
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            namespace = f.read().strip()
    if not namespace:
        raise KubernetesStoreError(f"{url!r} names no namespace, and this is not a pod: use kubernetes://NAMESPACE")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace) or len(namespace) > 63:
        raise KubernetesStoreError(f"invalid namespace {namespace!r} in {url!r}")
    return namespace, options


def api_client(kubeconfig: str | None = None, context: str | None = None, *, retries: Any = None) -> Any:
    """A ``kubernetes.client.ApiClient``: in-cluster credentials in a pod, else the kubeconfig.

    ``retries``: urllib3's retry policy for its connections (None: urllib3's default, 3 of each kind).
    """
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config  # partly typed: treated as untyped
    cfg = client.Configuration()
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
        cfg.retries = retries
        return client.ApiClient(cfg)
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        cfg.retries = retries
        return client.ApiClient(cfg)
    except Exception as exc:  # ConfigException, a missing file
        raise KubernetesStoreError(f"cannot load the kubeconfig ({kubeconfig or '$KUBECONFIG'}): {exc}") from exc


def api_status(exc: BaseException) -> int | None:
    """The HTTP status of a failed API server call (404, 409, 410 ...), None for other errors."""
    return getattr(exc, "status", None)


def unreachable(exc: BaseException) -> bool:
    """Whether a failed call means the API server (or etcd behind it) cannot answer now: no connection,
    a timeout, or a 429/5xx answer. Those become :class:`StoreUnavailable`; a 4xx is an answer."""
    import urllib3

    status = api_status(exc)
    if isinstance(status, int) and status > 0:
        return status == 429 or status >= 500
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def _family(key: str) -> str:
    """The family of a key: its part before the first "/" ("" for a key without one)."""
    head, slash, _rest = key.partition("/")
    return head if slash else ""


@dataclasses.dataclass
class _Order:
    """One key family's cache entries by revision (see ``KubernetesMetadataStore._orders``)."""

    pairs: builtins.list[tuple[int, str]] = dataclasses.field(default_factory=list)
    revisions: builtins.list[int] = dataclasses.field(default_factory=list)
    keys: int = 0  # distinct keys of the family in the cache (tombstones stay)


class KubernetesMetadataStore:
    """MetadataStore over MetadataDocument objects in one namespace (see the module docstring)."""

    def __init__(self, namespace: str, client_factory: Callable[[], Any]) -> None:
        from kubernetes import client

        self.namespace = namespace
        self._client_factory = client_factory
        self._api_client = client_factory()
        self._api: Any = client.CustomObjectsApi(self._api_client)
        # The watch cache (informer), started by the first changes_since.
        self._cond = threading.Condition()
        self._cache: dict[str, Document] = {}
        # Per key family (the key up to its first "/": topics, brokers, transactional_ids ...), the
        # (revision, key) of its cache entries in revision order, stale pairs left behind until
        # compacted: changes_since bisects the families its prefix covers instead of scanning the
        # whole cache. Every broker polls several times a second, the controller polls brokers/ and
        # controller, and 10,000 TransactionalIds are 10,000 entries none of those polls want.
        self._orders: dict[str, _Order] = {}
        self._synced = -1  # every event up to this revision is in the cache; -1: not listed yet
        self._wanted = 0  # the highest revision this process wrote (read-your-writes)
        self._deleted: dict[str, int] = {}  # key -> version this process deleted, until the watch shows it
        self._watcher: threading.Thread | None = None
        self._closed = threading.Event()
        self._response: Any = None
        self._unreachable_until = 0.0  # monotonic: calls fail at once until then (_fail_fast)
        self._given_up_at = -1  # the watch's revision when changes_since last stopped waiting for it
        try:
            self._api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, limit=1)
        except Exception as exc:
            if api_status(exc) == 404:
                raise KubernetesStoreError(
                    f"the API server has no {PLURAL}.{GROUP}: install manifests/crds/ (or the Helm chart) first"
                ) from exc
            raise KubernetesStoreError(f"cannot reach the API server: {exc}") from exc

    @classmethod
    def from_url(cls, url: str) -> KubernetesMetadataStore:
        namespace, options = parse_url(url)
        kubeconfig, context = options.get("kubeconfig"), options.get("context")
        api_client(kubeconfig, context).close()  # fail now, with a clear error, if credentials are missing
        # A connection that cannot be made fails at once, not after urllib3's three retries of a
        # connect deadline each: a store call may run on a broker's event loop (module docstring).
        return cls(namespace, lambda: api_client(kubeconfig, context, retries=_store_retries()))

    # -- objects <-> documents --------------------------------------------------------------------

    @staticmethod
    def _doc(obj: dict[str, Any], deleted: bool = False) -> Document:
        rv = int(obj["metadata"]["resourceVersion"])
        spec = obj.get("spec") or {}
        value = None if deleted else json.loads(spec["value"])
        return Document(spec["key"], value, rv, rv)

    def _body(self, key: str, value: dict[str, Any], version: int | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": object_name(key), "namespace": self.namespace}
        label = prefix_label(key)
        if label is not None:
            metadata["labels"] = {PREFIX_LABEL: label}
        if version is not None:
            metadata["resourceVersion"] = str(version)
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": metadata,
            "spec": {"key": key, "value": json.dumps(value, sort_keys=True)},
        }

    # -- reads and writes (straight to the API server) --------------------------------------------

    def _fail_fast(self) -> None:
        """Within FAIL_FAST_S of a call that found the API server unreachable, fail without trying."""
        if time.monotonic() < self._unreachable_until:
            raise StoreUnavailable(f"cannot reach the API server (failed {FAIL_FAST_S:.0f} s ago or less)")

    def _raise_if_unreachable(self, exc: Exception) -> None:
        """Raise :class:`StoreUnavailable` when ``exc`` says the API server cannot answer (else return)."""
        if unreachable(exc):
            self._unreachable_until = time.monotonic() + FAIL_FAST_S
            raise StoreUnavailable(f"cannot reach the API server: {exc}") from exc

    def get(self, key: str) -> Document | None:
        self._fail_fast()
        try:
            obj = self._api.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, object_name(key), _request_timeout=REQUEST_TIMEOUT_S
            )
        except Exception as exc:
            if api_status(exc) == 404:
                return None
            self._raise_if_unreachable(exc)
            raise
        return self._doc(obj)

    def list(self, prefix: str) -> builtins.list[Document]:
        self._fail_fast()
        label = prefix_label(prefix) if prefix.endswith("/") and prefix.count("/") == 1 else None
        selector = f"{PREFIX_LABEL}={label}" if label else ""
        try:
            result = self._api.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, label_selector=selector, _request_timeout=REQUEST_TIMEOUT_S
            )
        except Exception as exc:
            self._raise_if_unreachable(exc)
            raise
        docs = [self._doc(o) for o in result.get("items", [])]
        return sorted((d for d in docs if d.key.startswith(prefix)), key=lambda d: d.key)

    def _wrote(self, revision: int) -> None:
        with self._cond:
            self._wanted = max(self._wanted, revision)

    def compare_and_set(self, key: str, value: dict[str, Any], expected_version: int | None) -> Document:
        self._fail_fast()
        try:
            if expected_version is None:
                obj = self._api.create_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    self._body(key, value, None),
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            else:
                obj = self._api.replace_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    object_name(key),
                    self._body(key, value, expected_version),
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
        except Exception as exc:
            if api_status(exc) in (404, 409):
                raise VersionConflict(f"{key}: expected version {expected_version}: {_reason(exc)}") from None
            self._raise_if_unreachable(exc)
            raise
        doc = self._doc(obj)
        if _family(key) not in UNWATCHED_FAMILIES:  # the watch never delivers those: nothing to wait for
            self._wrote(doc.revision)
        return Document(key, value, doc.version, doc.revision)

    def delete(self, key: str, expected_version: int) -> None:
        from kubernetes import client

        self._fail_fast()
        try:
            self._api.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                object_name(key),
                body=client.V1DeleteOptions(
                    preconditions=client.V1Preconditions(resource_version=str(expected_version))
                ),
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except Exception as exc:
            if api_status(exc) in (404, 409):
                raise VersionConflict(f"{key}: expected version {expected_version}: {_reason(exc)}") from None
            self._raise_if_unreachable(exc)
            raise
        with self._cond:
            self._deleted[key] = expected_version

    # -- the watch cache --------------------------------------------------------------------------

    def changes_since(self, revision: int, prefix: str = "") -> builtins.list[Document]:
        self._start_watch()
        deadline = time.monotonic() + READ_YOUR_WRITES_WAIT_S
        with self._cond:
            # Waited in vain before and the watch has delivered nothing since (the API server cut
            # off, say): answer from the cache at once rather than wait again on every poll.
            stalled = self._given_up_at >= 0 and self._synced <= self._given_up_at
            while not stalled and not self._closed.is_set() and not self._caught_up():
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("the metadata watch is behind this process's own writes; answering from the cache")
                    self._given_up_at = self._synced
                    break
                self._cond.wait(left)
            else:
                if not stalled:
                    self._given_up_at = -1
            head, slash, _rest = prefix.partition("/")
            if slash:  # within one family
                orders = [self._orders[head]] if head in self._orders else []
            else:  # keys without "/", and every family whose name the prefix begins
                orders = [o for family, o in self._orders.items() if family == "" or family.startswith(prefix)]
            found = []
            for order in orders:
                start = bisect.bisect_right(order.revisions, revision)
                for rev, key in order.pairs[start:]:
                    doc = self._cache.get(key)
                    if doc is not None and doc.revision == rev and key.startswith(prefix):
                        found.append(doc)  # else a later pair of the same key is newer: this one is stale
        return found if len(orders) <= 1 else sorted(found, key=lambda d: d.revision)

    def _put(self, doc: Document) -> None:
        """Put ``doc`` in the cache and its family's revision order (called under ``_cond``)."""
        new_key = doc.key not in self._cache
        self._cache[doc.key] = doc
        order = self._orders.setdefault(_family(doc.key), _Order())
        order.keys += new_key
        if order.revisions and doc.revision < order.revisions[-1]:
            self._reindex()  # not in watch order: rebuild
            return
        order.pairs.append((doc.revision, doc.key))
        order.revisions.append(doc.revision)
        if len(order.pairs) > 2 * order.keys + 1024:
            self._reindex()  # mostly stale pairs: keep one per key

    def _reindex(self) -> None:
        self._orders = {}
        for doc in sorted(self._cache.values(), key=lambda d: (d.revision, d.key)):
            order = self._orders.setdefault(_family(doc.key), _Order())
            order.keys += 1
            order.pairs.append((doc.revision, doc.key))
            order.revisions.append(doc.revision)

    def _caught_up(self) -> bool:
        if self._synced < 0 or self._synced < self._wanted:
            return False
        for key, version in list(self._deleted.items()):
            seen = self._cache.get(key)
            if seen is not None and seen.value is not None and seen.version <= version:
                return False
            del self._deleted[key]
        return True

    def _start_watch(self) -> None:
        with self._cond:
            if self._watcher is not None or self._closed.is_set():
                return
            self._watcher = threading.Thread(target=self._watch_loop, name="sluice-metadata-watch", daemon=True)
            self._watcher.start()

    def _relist(self, api: Any) -> int:
        result = api.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, label_selector=WATCH_SELECTOR
        )
        listed = int(result["metadata"]["resourceVersion"])
        docs = {d.key: d for d in (self._doc(o) for o in result.get("items", []))}
        with self._cond:
            for key, old in self._cache.items():
                if key not in docs and old.value is not None:
                    docs[key] = Document(key, None, listed, listed)  # vanished while not watched
                elif key not in docs:
                    docs[key] = old
            self._cache = docs
            self._reindex()
            self._synced = max(self._synced, listed)
            self._cond.notify_all()
        return listed

    def _apply_event(self, event: dict[str, Any]) -> int | None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                return None  # too old: relist
            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
        rv = int(obj["metadata"]["resourceVersion"])
        with self._cond:
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._put(self._doc(obj, deleted=kind == "DELETED"))
            self._synced = max(self._synced, rv)
            self._cond.notify_all()
        return rv

    def _watch_loop(self) -> None:
        from kubernetes import client

        api: Any = client.CustomObjectsApi(self._client_factory())
        revision: int | None = None
        failures = 0
        while not self._closed.is_set():
            try:
                if revision is None:
                    revision = self._relist(api)
                response: Any = api.list_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    watch=True,
                    label_selector=WATCH_SELECTOR,
                    resource_version=str(revision),
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    _preload_content=False,
                    _request_timeout=(10, WATCH_TIMEOUT_S + 10),
                )
                self._response = response
                buffer = b""
                for chunk in response.stream(65536, decode_content=True):
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            revision = self._apply_event(json.loads(line))
                            if revision is None:
                                break
                    if revision is None:
                        break
                response.release_conn()
                failures = 0
            except Exception as exc:
                if self._closed.is_set():
                    break
                failures += 1
                if api_status(exc) == 410:
                    revision = None
                log.warning("metadata watch failed (%s); watching again", exc)
                self._closed.wait(min(0.1 * 2**failures, 2.0))
        api.api_client.close()

    def close(self) -> None:
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown() if hasattr(response, "shutdown") else response.close()
        if self._watcher is not None:
            self._watcher.join(timeout=2.0)
        self._api_client.close()


def _store_retries() -> Any:
    """No retry of a connect; one of anything else (a pooled connection the server closed meanwhile)."""
    import urllib3

    return urllib3.Retry(total=1, connect=0, backoff_factor=0)


def _reason(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    try:
        return str(json.loads(body)["message"]) if body else str(exc)
    except (ValueError, KeyError, TypeError):
        return str(exc)
