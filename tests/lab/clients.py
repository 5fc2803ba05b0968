"""Connections from each client library the lab uses, all named with the connection_name
client property (the expectations pin findings to it). The libraries differ in how they batch
frames, acks and confirms, which is why scenarios use several."""

from __future__ import annotations

import aio_pika
import amqp
import pika

from tests.lab import broker


def pika_connection(name: str, port: int = broker.PORT, **parameters) -> pika.BlockingConnection:
    """pika's BlockingConnection announces the connection.blocked capability by default."""
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=broker.HOST, port=port, credentials=pika.PlainCredentials(broker.USER, broker.PASSWORD),
        client_properties={"connection_name": name}, **parameters))


def amqp_connection(name: str, **options) -> amqp.Connection:
    """py-amqp. Its confirm mode is left off at the connection level (confirm_publish=False) so
    that channels can call confirm_select() and publish without waiting for each confirm."""
    connection = amqp.Connection(f"{broker.HOST}:{broker.PORT}", userid=broker.USER, password=broker.PASSWORD,
                                 client_properties={"connection_name": name}, **options)
    connection.connect()
    return connection


async def aio_connection(name: str, capabilities: dict | None = None, **options) -> aio_pika.abc.AbstractConnection:
    """`capabilities`, if given, replaces the whole table aio-pika announces."""
    properties = {"connection_name": name} | ({"capabilities": capabilities} if capabilities is not None else {})
    return await aio_pika.connect(host=broker.HOST, port=broker.PORT, login=broker.USER, password=broker.PASSWORD,
                                  client_properties=properties, **options)
