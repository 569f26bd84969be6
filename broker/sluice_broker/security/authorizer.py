"""The authorization decision, Kafka's AclAuthorizer rules.

For ``principal`` from ``host`` wanting ``operation`` on a resource:

1. a super user (``super.users``) is allowed everything;
2. the ACLs whose pattern covers the resource are gathered (literal name, literal ``*``,
   prefixes of the name);
3. none at all: allowed only when ``allow.everyone.if.no.acl.found`` (off by default, as the
   issue asks: deny by default when the authorizer is on);
4. any matching DENY (same principal or ``User:*``, same host or ``*``, the operation or ALL)
   refuses, whatever allows: DENY wins;
5. else a matching ALLOW of the operation, of ALL, or of an operation that implies it (Read,
   Write, Delete, Alter imply Describe; AlterConfigs implies DescribeConfigs) allows;
6. else refused.

A transactional id declared by a TransactionalId resource with ``allowedUsers`` /
``allowedServiceAccounts`` (its ``transactional_ids/<id>`` document's ``allowed_principals``)
is the resource's to give, the way a Strimzi KafkaUser's ACLs are its own: after the super-user
rule, a principal not listed is refused every operation on that id whatever its ACLs allow, and
a listed one may Write and Describe it without an ACL (a DENY ACL still wins). Without the
fields (or without a document) the id is governed by ACLs alone, as in Kafka.

The decision is pure: the ACLs are handed over (:meth:`Authorizer.set_acls`) by
:class:`AclWatch`, which follows the ``acls/`` documents of the metadata store (a watch by
revision, polled with the rest of the metadata). :class:`Access` is what the servicers and the
Kafka listener's handlers ask: the caller's principal and host (from a gRPC call, or the
:class:`~sluice.broker.security.peers.Caller` of a Kafka connection), and the answer (everything
is allowed when the authorizer is off).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from sluice.acls import IMPLIED_BY, WILDCARD, AclBinding, AclOperation, AclPermissionType, ResourceType
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.config import BrokerConfig
from sluice.broker.security.peers import (
    Caller,
    ClusterIdentity,
    is_broker_name,
    peer_certificate,
    peer_common_name,
)
from sluice.broker.security.tokens import TOKEN_PRINCIPAL
from sluice.metadata import keys
from sluice.metadata.documents import TransactionalIdDocument
from sluice.metadata.store import MetadataStore

Ctx = grpc.aio.ServicerContext[Any, Any]
# Who asks: a gRPC call (its TLS auth context and peer), or a Kafka connection's Caller.
Who = Ctx | Caller
CLUSTER_NAME = "kafka-cluster"
# What a principal listed by a TransactionalId resource may do on the id without an ACL.
_LISTED_MAY = frozenset({AclOperation.WRITE, AclOperation.DESCRIBE})


def operation_name(op: AclOperation) -> str:
    """Kafka's name of an operation: ``AlterConfigs``, ``Write``."""
    return op.name.title().replace("_", "")


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request, or one key of it, refused: Kafka's code, why, and for how long (ms, quotas only)."""

    code: pb.ErrorCode
    message: str
    throttle_ms: int = 0


def topic_refusal(op: AclOperation, topic: str) -> str:
    """What a refused topic is told, in both protocols."""
    return f"not authorized to {operation_name(op)} topic {topic!r} (no ACL allows it)"


def _principal_matches(acl: AclBinding, principal: str) -> bool:
    if acl.principal == principal:
        return True
    kind, _, name = acl.principal.partition(":")
    return name == WILDCARD and principal.partition(":")[0] == kind


class Authorizer:
    def __init__(self, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        self._txn_principals: dict[str, frozenset[str]] = {}

    def set_acls(self, acls: Iterable[AclBinding]) -> None:
        by_type: dict[ResourceType, list[AclBinding]] = {}
        for acl in acls:
            by_type.setdefault(acl.resource_type, []).append(acl)
        self._by_type = by_type  # swapped whole: a concurrent check sees the old set or the new

    def set_transactional_id_principals(self, allowed: Mapping[str, Iterable[str]]) -> None:
        """The ids whose TransactionalId resource lists its principals (empty lists are left out)."""
        self._txn_principals = {name: frozenset(ps) for name, ps in allowed.items() if ps}  # swapped whole

    def authorize(
        self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType, name: str
    ) -> bool:
        if principal in self.super_users:
            return True
        covering = [a for a in self._by_type.get(resource_type, ()) if a.matches_resource(resource_type, name)]
        mine = [a for a in covering if _principal_matches(a, principal) and a.host in (host, WILDCARD)]
        denied = any(
            a.permission_type == AclPermissionType.DENY and a.operation in (operation, AclOperation.ALL) for a in mine
        )
        if resource_type == ResourceType.TRANSACTIONAL_ID:
            listed = self._txn_principals.get(name)
            if listed is not None:
                if principal not in listed:
                    return False  # the resource names who may use the id: nobody else, whatever the ACLs say
                if operation in _LISTED_MAY and not denied:
                    return True
        if not covering:
            return self.allow_everyone_if_no_acl_found
        if denied:
            return False
        allowing = {operation, AclOperation.ALL} | IMPLIED_BY.get(operation, frozenset())
        return any(a.permission_type == AclPermissionType.ALLOW and a.operation in allowing for a in mine)

    def allows_some(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Whether ``operation`` is allowed on at least one resource of the type (KIP-679); super users: yes."""
        if principal in self.super_users:
            return True
        return _allows_some(self, principal, host, operation, resource_type)


def _allows_some(authorizer: Authorizer, principal: str, host: str, op: AclOperation, rtype: ResourceType) -> bool:
    """An ALLOW of ``op`` (or ALL) for the principal on some pattern of the type, not denied on every name."""
    mine = [
        a for a in authorizer._by_type.get(rtype, ()) if _principal_matches(a, principal) and a.host in (host, WILDCARD)
    ]
    if any(
        a.permission_type == AclPermissionType.DENY
        and a.operation in (op, AclOperation.ALL)
        and a.name == WILDCARD
        and a.pattern_type.name == "LITERAL"
        for a in mine
    ):
        return False
    return any(a.permission_type == AclPermissionType.ALLOW and a.operation in (op, AclOperation.ALL) for a in mine)


class AclWatch:
    """Keeps an :class:`Authorizer`'s ACLs equal to the store's ``acls/`` documents, and its
    TransactionalId principals equal to the ``transactional_ids/`` documents'."""

    def __init__(self, store: MetadataStore, authorizer: Authorizer) -> None:
        self.store = store
        self.authorizer = authorizer
        self._revision = 0
        self._acls: dict[str, AclBinding] = {}
        self._txn_revision = 0
        self._txn_principals: dict[str, list[str]] = {}

    def refresh(self) -> None:
        changed = False
        for doc in self.store.changes_since(self._revision, keys.ACLS):
            self._revision = max(self._revision, doc.revision)
            if doc.value is None:
                changed |= self._acls.pop(doc.key, None) is not None
            else:
                self._acls[doc.key] = AclBinding.from_json(doc.value)
                changed = True
        if changed:
            self.authorizer.set_acls(self._acls.values())
        self._refresh_transactional_ids()

    def _refresh_transactional_ids(self) -> None:
        changed = False
        for doc in self.store.changes_since(self._txn_revision, keys.TRANSACTIONAL_IDS):
            self._txn_revision = max(self._txn_revision, doc.revision)
            name = doc.key[len(keys.TRANSACTIONAL_IDS) :]
            listed = [] if doc.value is None else TransactionalIdDocument.from_json(doc.value).allowed_principals
            if listed:
                changed |= self._txn_principals.get(name) != listed
                self._txn_principals[name] = listed
            else:
                changed |= self._txn_principals.pop(name, None) is not None
        if changed:
            self.authorizer.set_transactional_id_principals(self._txn_principals)


def peer_host(ctx: Ctx) -> str:
    """The caller's address without its port (``ipv4:127.0.0.1:5555`` -> ``127.0.0.1``)."""
    peer = ctx.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host = rest.rsplit(":", 1)[0]
        return host[1:-1] if host.startswith("[") else host
    return peer


class Access:
    """What the servicers and the Kafka handlers ask: may ``who`` do ``operation`` on a resource?"""

    def __init__(
        self, config: BrokerConfig, store: MetadataStore | None = None, identity: ClusterIdentity | None = None
    ) -> None:
        self.identity = identity or ClusterIdentity(None)
        self.enabled = bool(config.get("authorizer.enabled"))
        supers = [s.strip() for s in str(config.get("super.users")).split(";") if s.strip()]
        self.authorizer = Authorizer(supers, bool(config.get("allow.everyone.if.no.acl.found")))
        self.watch = AclWatch(store, self.authorizer) if store is not None and self.enabled else None

    def refresh(self) -> None:
        if self.watch is not None:
            self.watch.refresh()

    def caller(self, who: Who) -> Caller:
        """The :class:`Caller` behind a gRPC call (or the Caller itself)."""
        if isinstance(who, Caller):
            return who
        by_token = TOKEN_PRINCIPAL.get()
        if by_token is not None:  # a token listener's caller: its ServiceAccount, never a broker
            return Caller.of_token(by_token, peer_host(who))
        name = peer_common_name(who)
        # the certificate is fetched (and its signature checked, once) only behind a broker's CN:
        # every call of every client comes through here
        is_broker = is_broker_name(name) and self.identity.is_broker(name, peer_certificate(who))
        return Caller.of_certificate(name, peer_host(who), is_broker=is_broker)

    def allowed(self, who: Who, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        if not self.enabled:
            return True
        caller = self.caller(who)
        if caller.is_broker:
            return True  # the brokers of this cluster (cluster CA certificates) are super users, as in Kafka
        return self.authorizer.authorize(caller.principal, caller.host, operation, resource_type, name)

    def denied_topics(self, who: Who, operation: AclOperation, names: Iterable[str]) -> set[str]:
        """The topics among ``names`` ``who`` may not ``operation``: Kafka's partial denial, where
        the refused topics are answered TOPIC_AUTHORIZATION_FAILED and the rest is served."""
        if not self.enabled:
            return set()
        return {n for n in set(names) if not self.allowed(who, operation, ResourceType.TOPIC, n)}

    def allowed_on_some(self, who: Who, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Whether some resource of the type allows ``operation`` (KIP-679's test for idempotent producers)."""
        if not self.enabled:
            return True
        caller = self.caller(who)
        if caller.is_broker:
            return True
        return self.authorizer.allows_some(caller.principal, caller.host, operation, resource_type)

    def cluster(self, who: Who, operation: AclOperation) -> bool:
        return self.allowed(who, operation, ResourceType.CLUSTER, CLUSTER_NAME)
