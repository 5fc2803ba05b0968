"""A py-amqp publisher in confirm mode that does not wait for each confirm.

py-amqp's own confirm mode (confirm_publish=True) waits for every confirm in turn, which is
the synchronous pattern; here the channel is put in confirm mode directly and confirms are
collected from its events, so scenarios choose how many may be outstanding."""

from __future__ import annotations

import socket
from contextlib import contextmanager

import amqp

from tests.lab.scenarios.waiting import drain_amqp_until


class ConfirmingPublisher:
    def __init__(self, connection: amqp.Connection, channel: amqp.Channel | None = None):
        self.connection = connection
        self.channel = channel or connection.channel()
        self.channel.confirm_select()
        self.channel.events["basic_ack"].add(self._on_ack)
        self.channel.events["basic_nack"].add(self._on_nack)
        self.channel.events["basic_return"].add(self._on_return)
        self.published = 0
        self.acked: set[int] = set()
        self.nacked: set[int] = set()
        self.returned = 0

    def publish(self, body: bytes, routing_key: str, *, message_id: str, exchange: str = "",
                persistent: bool = False, mandatory: bool = False) -> None:
        message = amqp.Message(body, message_id=message_id, delivery_mode=2 if persistent else 1)
        self.channel.basic_publish(message, exchange=exchange, routing_key=routing_key, mandatory=mandatory)
        self.published += 1

    @property
    def outstanding(self) -> int:
        return self.published - len(self.acked) - len(self.nacked)

    def wait_until_outstanding(self, at_most: int, seconds: float = 15) -> None:
        drain_amqp_until(self.connection, lambda: self.outstanding <= at_most, seconds,
                         f"confirms (outstanding {self.outstanding}, want at most {at_most})")

    def publish_windowed(self, bodies: list[tuple[bytes, str, dict]], window: int) -> None:
        """Publish (body, routing_key, options) keeping at most `window` confirms outstanding,
        then wait for the rest.

        The window is refilled once half of it is confirmed, in one burst written with the
        socket corked. The broker confirms a message faster than Python publishes the next, so
        publishes trickling out one by one would show, on the wire, each publish after the
        previous confirm: the very picture of a synchronous publisher. Corked, a burst leaves
        in full segments, as from clients that batch their writes."""
        pending = list(bodies)
        while pending:
            burst, pending = pending[:window - self.outstanding], pending[window - self.outstanding:]
            with self.corked():
                for body, routing_key, options in burst:
                    self.publish(body, routing_key, **options)
            self.wait_until_outstanding(window // 2 if pending else 0)

    @contextmanager
    def corked(self):
        self.connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        try:
            yield
        finally:
            self.connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)

    def _settle(self, into: set[int], tag: int, multiple: bool) -> None:
        settled = self.acked | self.nacked
        into.update(t for t in (range(1, tag + 1) if multiple else [tag]) if t not in settled)

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(self.acked, tag, multiple)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._settle(self.nacked, tag, multiple)

    def _on_return(self, *_returned) -> None:
        self.returned += 1
