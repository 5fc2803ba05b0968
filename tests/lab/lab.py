"""What one scenario run gets: unique broker names, declarations, and the recording.

Queues and exchanges are declared through an admin connection that is closed before the
recording starts, and deleted after it stops, so captures hold only the scenario's own traffic
and runs never share broker state.
"""

from __future__ import annotations

import secrets
from contextlib import contextmanager
from pathlib import Path

import pika.exceptions

from tests.lab import broker
from tests.lab.clients import pika_connection
from tests.lab.errors import LabError
from tests.lab.recording import Recording

# Not named after a scenario, so the admin connection is never kept in a scenario's capture.
ADMIN_CONNECTION = "lab-admin"


def connection_name(scenario: str, role: str) -> str:
    """The AMQP connection_name client property of every lab connection, which the
    expectations pin findings to: 'lab-lost_confirms-tcp-cut'."""
    return f"lab-{scenario}-{role}"


class Lab:
    def __init__(self, scenario: str, workdir: Path):
        self.scenario = scenario
        self.prefix = f"lab.{scenario}.{secrets.token_hex(3)}"
        self.recording = Recording(workdir / f"{scenario}.raw.pcapng")
        # Connections opened before the recording started, by client port (see mid_stream).
        self.names_by_port: dict[int, str] = {}
        self._queues: list[str] = []
        self._exchanges: list[str] = []
        self._admin = None  # a channel, opened by the first declaration, closed before recording

    def name(self, what: str) -> str:
        return f"{self.prefix}.{what}"

    @contextmanager
    def recorded(self):
        """The scenario's traffic goes inside: `with lab.recorded(): ...`."""
        self._close_admin()
        self.recording.start()
        try:
            yield
        finally:
            self.recording.stop()

    def queue(self, what: str, *, durable: bool = False, arguments: dict | None = None,
              bind_to: str | None = None, routing_key: str = "") -> str:
        name = self.name(what)
        self._admin_channel().queue_declare(name, durable=durable, arguments=arguments)
        self._queues.append(name)
        if bind_to is not None:
            self._admin_channel().queue_bind(name, bind_to, routing_key=routing_key)
        return name

    def exchange(self, what: str, *, kind: str = "direct") -> str:
        name = self.name(what)
        self._admin_channel().exchange_declare(name, exchange_type=kind)
        self._exchanges.append(name)
        return name

    def cleanup(self) -> None:
        self.recording.stop()
        try:
            channel = self._admin_channel()
            for queue in self._queues:
                channel.queue_delete(queue)
            for exchange in self._exchanges:
                channel.exchange_delete(exchange)
        finally:
            self._close_admin()

    def _admin_channel(self):
        if self.recording.active:
            raise LabError("declarations go before the recording, so the capture holds only the scenario")
        if self._admin is None:
            try:
                self._admin = pika_connection(ADMIN_CONNECTION).channel()
            except pika.exceptions.AMQPConnectionError as unreachable:
                raise LabError(f"RabbitMQ is not reachable at {broker.HOST}:{broker.PORT}: {unreachable!r}") \
                    from unreachable
        return self._admin

    def _close_admin(self) -> None:
        if self._admin is not None and self._admin.connection.is_open:
            self._admin.connection.close()
        self._admin = None
