"""The Kafka-protocol listener: an asyncio TCP server on the broker's own event loop.

One task per connection reads a frame, decodes its header, dispatches it to the
API's handler (:mod:`sluice.broker.kafka.handlers`) and writes the response,
in order: Kafka clients pipeline requests on a connection and match responses
to them by order as well as by correlation id, so a connection's requests are
answered one after the other (parallelism comes from connections and from the
broker's other work on the loop while a handler awaits).

Bad input never reaches a handler half-decoded and never takes the broker
down. A size prefix above ``socket.request.max.bytes``, a truncated frame, an
unknown API key, a version this broker does not serve (but ApiVersions, which
answers at v0 with UNSUPPORTED_VERSION: KIP-511) or a body that does not decode
close the connection, as Kafka does, with one log line naming the peer and the
reason. So does a connection without a complete request for
``connections.max.idle.ms`` (Kafka's key and default, 10 minutes): an idle
client, or one that began a frame and stalled, does not hold its socket
forever. A handler that fails unexpectedly closes its connection too (the
exception is logged once): the client reconnects and retries.

The listener advertises its address in this broker's ``brokers/<id>`` document
(:data:`~sluice.broker.kafka.context.KAFKA_ADDRESS_FIELD`) so that every broker
can name it in Metadata.

Security follows the broker's ``--client-listener`` (:mod:`~sluice.broker.kafka.transport`):
with TLS a connection's first step is the handshake, and a connection whose
handshake fails is closed before any request is read. Each connection then gets
its own copy of the context carrying its caller (``User:<CN>`` of its client
certificate; on a token listener the ServiceAccount its SASL OAUTHBEARER
authentication proved, and no other request is served before that:
:mod:`~sluice.broker.kafka.authentication`), which every handler's authorization
asks about (:mod:`~sluice.broker.kafka.authorization`). Produce and Fetch are counted
against the caller's byte-rate quotas after the handler answered
(:mod:`~sluice.broker.kafka.quotas`): the throttle time goes into the response,
and the connection is muted (or, for clients older than KIP-219, the response
held) for that long.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from sluice.broker.kafka import quotas, transport
from sluice.broker.kafka.authentication import ReviewFailed, SaslSession
from sluice.broker.kafka.context import KAFKA_ADDRESS_FIELD, KafkaContext
from sluice.broker.kafka.framing import (
    API_VERSIONS_KEY,
    FrameError,
    Request,
    parse_request,
    read_frame,
    response_segments,
)
from sluice.broker.kafka.handlers import Handler, build_handlers
from sluice.broker.kafka.handlers.api_versions import ApiVersionsHandler
from sluice.broker.kafka_wire import codec
from sluice.broker.kafka_wire.codec import DecodeError, Message
from sluice.broker.kafka_wire.messages import APIS
from sluice.broker.security.connections import ConnectionQuotas
from sluice.broker.security.tokens import TokenAuthenticator
from sluice.metadata import documents, keys
from sluice.metadata.documents import BrokerDocument

log = logging.getLogger(__name__)


class KafkaListener:
    def __init__(self, ctx: KafkaContext, authenticator: TokenAuthenticator | None = None) -> None:
        self.ctx = ctx
        # a token listener: SASL OAUTHBEARER with the gRPC token listener's authenticator (one cache)
        self.authenticator = authenticator
        if ctx.config.client_listener == "token" and authenticator is None:
            raise ValueError("a Kafka listener beside a token client listener needs the token authenticator")
        self.handlers: dict[int, Handler] = build_handlers(sasl=authenticator is not None)
        self.max_reauth_ms = ctx.config.int("connections.max.reauth.ms")
        # before SASL authentication a frame is at most this big (Kafka's key and default, 512 KiB):
        # a client that has not authenticated cannot make the broker buffer socket.request.max.bytes
        self.sasl_max_bytes = ctx.config.int("sasl.server.max.receive.size")
        self.max_bytes = ctx.config.int("socket.request.max.bytes")
        self.idle_s = ctx.config.int("connections.max.idle.ms") / 1000
        self.tls = transport.ServerContexts(ctx.config)  # follows reloaded certificates
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        # max.connections.per.ip & co. (sluice.broker.security.connections), counted at accept and close
        self.connection_quotas = ConnectionQuotas.from_config(ctx.config)
        self.address: tuple[str, int] | None = None

    async def start(self, host: str, port: int, advertised: tuple[str, int] | None = None) -> None:
        """Listen on ``host:port`` and advertise ``advertised`` (default: the address listened on)."""
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True)
        bound = self._server.sockets[0].getsockname()
        self.address = (host, int(bound[1]))
        adv_host, adv_port = advertised or self.address
        if adv_host in ("0.0.0.0", "::", ""):
            adv_host = self.ctx.config.host
        address = f"[{adv_host}]:{adv_port}" if ":" in adv_host else f"{adv_host}:{adv_port}"
        self._advertise(address)
        cfg = self.ctx.config
        log.info("broker %d serves the Kafka protocol on %s:%d (advertised as %s, %s)",
                 cfg.broker_id, host, self.address[1], address, cfg.client_listener)  # fmt: skip

    def _advertise(self, address: str) -> None:
        def change(doc: BrokerDocument | None) -> BrokerDocument | None:
            if doc is None or doc.extra.get(KAFKA_ADDRESS_FIELD) == address:
                return None
            return dataclasses.replace(doc, extra={**doc.extra, KAFKA_ADDRESS_FIELD: address})

        cfg = self.ctx.config
        documents.update_document(self.ctx.cluster.store, keys.broker(cfg.broker_id), BrokerDocument, change)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=2.0)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else ""
        refused = self.connection_quotas.open(host)
        if refused is not None:  # as Kafka: the new connection is closed at once, with a log line
            self._connections.discard(task)
            log.warning("kafka listener: closing the connection from %s: %s", peer, refused)
            writer.close()
            return
        try:
            # the handshake is the first await (transport.handshake): nothing may be read before it
            context = self.tls.current()  # None: plaintext
            if context is not None and not await transport.handshake(writer, context):
                return
            conn = dataclasses.replace(self.ctx, caller=transport.connection_caller(writer, self.ctx.access.identity))
            if self.authenticator is not None:  # nothing is served before SASL authentication
                conn.sasl = SaslSession(self.authenticator, self.max_reauth_ms)
            await self._connection(conn, reader, writer)
        except FrameError as exc:
            log.warning("kafka listener: closing the connection from %s: %s", peer, exc)
        except ReviewFailed as exc:  # closed without an answer: the client reconnects and tries again
            log.warning("kafka listener: closing the connection from %s: cannot check its token now: %s", peer, exc)
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("kafka listener: closing the connection from %s after an internal error", peer)
        finally:
            self.connection_quotas.close(host)
            self._connections.discard(task)
            writer.close()

    async def _connection(self, conn: KafkaContext, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                if conn.sasl is not None and conn.sasl.principal is None:  # not authenticated yet
                    read = read_frame(reader, self.sasl_max_bytes, "sasl.server.max.receive.size")
                else:
                    read = read_frame(reader, self.max_bytes)
                frame = await asyncio.wait_for(read, self.idle_s)
            except TimeoutError:
                # idle, or a frame begun and not finished (a stalled or slow client): Kafka closes both
                raise FrameError(f"no complete request within connections.max.idle.ms ({self.idle_s:g} s)") from None
            if frame is None:
                return
            answer, throttle = await self._answer(conn, frame)
            if throttle is not None and throttle.hold_response:
                await asyncio.sleep(throttle.ms / 1000)  # a client older than KIP-219: the response waits
            if answer is not None:  # None: a request Kafka does not answer (Produce with acks=0)
                for segment in answer:  # a fetch answer's batches as read, not joined into one frame
                    writer.write(segment)
                await writer.drain()
            if conn.sasl is not None and conn.sasl.closing is not None:  # a failed or illegal SASL exchange
                log.info("kafka listener: closing the connection from %s: %s", conn.caller.host, conn.sasl.closing)
                return
            if throttle is not None and not throttle.hold_response:
                await asyncio.sleep(throttle.ms / 1000)  # muted: no request is read meanwhile (KIP-219)

    async def _answer(
        self, conn: KafkaContext, frame: bytes
    ) -> tuple[list[codec.Buffer] | None, quotas.Throttle | None]:
        request = parse_request(frame)
        response, version = await self._respond(conn, request)
        key, correlation_id = request.header.request_api_key, request.header.correlation_id
        out = None if response is None else response_segments(key, correlation_id, response, version)
        response_bytes = 0 if out is None else sum(len(s) for s in out)
        throttle = quotas.throttle(conn, key, version, len(frame) + 4, response_bytes, request.header.client_id)
        if throttle is not None and quotas.report(response, throttle.ms):
            assert response is not None
            out = response_segments(key, correlation_id, response, version)  # again, with the throttle time
        return out, throttle

    async def _respond(self, conn: KafkaContext, request: Request) -> tuple[Message | None, int]:
        """The handler's response to ``request`` and the version to encode it at."""
        header = request.header
        key, version = header.request_api_key, header.request_api_version
        if conn.sasl is not None and (refused := conn.sasl.admits(key)) is not None:
            raise FrameError(f"{APIS[key].name}: {refused}")
        handler = self.handlers.get(key)
        api = APIS[key]  # parse_request refused unknown keys
        if handler is None:
            raise FrameError(f"API {api.name} ({key}) is not served by this listener")
        if version not in handler.versions:
            if key == API_VERSIONS_KEY and version > handler.versions.hi:
                assert isinstance(handler, ApiVersionsHandler)
                return handler.unsupported(), 0
            raise FrameError(
                f"{api.name} v{version} is not served (versions {handler.versions.lo}-{handler.versions.hi})"
            )
        try:
            body, left_over = codec.decode_request(api.request, request.body, version)
        except DecodeError as exc:
            raise FrameError(f"undecodable {api.name} v{version} body: {exc}") from None
        if left_over:  # ignored as Kafka's broker ignores them (librdkafka 2.16's Metadata sends 3)
            log.debug("%s v%d from %r: %d bytes after the body ignored", api.name, version, header.client_id, left_over)
        return await handler.handle(conn, header, body), version
