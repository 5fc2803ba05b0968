"""amqps traffic for the TLS tests: real clients (pika, aio-pika) over the broker's TLS listener on
127.0.0.1:5671 (deploy/ci/services.sh), each writing its key log, recorded with dumpcap on lo."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import aio_pika
import pika

from tests.lab.broker import sent_then_reset
from tests.lab.recording import start_dumpcap, stop_dumpcap

HOST, TLS_PORT, PLAIN_PORT, USER, PASSWORD = "127.0.0.1", 5671, 5672, "guest", "guest"
CA = "/var/lib/ackscope-test-tls/ca.pem"
VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def client_context(version: str, keylog: Path | None, ciphers: str | None = None) -> ssl.SSLContext:
    """A client context for the test broker, forced to one TLS version, writing its key log."""
    context = ssl.create_default_context(cafile=CA)
    context.minimum_version = context.maximum_version = VERSIONS[version]
    if ciphers:
        context.set_ciphers(ciphers)
    if keylog is not None:
        context.keylog_filename = str(keylog)
    return context


def pika_connection(name: str, context: ssl.SSLContext | None) -> pika.BlockingConnection:
    """Over TLS with `context`, else the same in plaintext (for the findings to compare)."""
    tls = {"port": TLS_PORT, "ssl_options": pika.SSLOptions(context, "localhost")} if context else {"port": PLAIN_PORT}
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=HOST, credentials=pika.PlainCredentials(USER, PASSWORD), client_properties={"connection_name": name},
        **tls))


@contextmanager
def recorded(path: Path, port: int = TLS_PORT):
    """dumpcap on lo for the broker port while the block runs."""
    dumpcap = start_dumpcap("-f", f"tcp port {port}", "-w", str(path))
    try:
        yield
    finally:
        stop_dumpcap(dumpcap)


def clean_traffic(name: str, context: ssl.SSLContext, queue: str, messages: int = 20) -> None:
    """Confirmed publishes, then a consumer with a prefetch that acks each delivery."""
    connection = pika_connection(name, context)
    channel = connection.channel()
    channel.queue_declare(queue, auto_delete=False, arguments={"x-expires": 60_000})
    channel.confirm_delivery()
    for number in range(messages):
        channel.basic_publish("", queue, b"message %d" % number, pika.BasicProperties(message_id=f"{name}-{number}"))
    channel.basic_qos(prefetch_count=10)
    got = 0
    for method, _, _ in channel.consume(queue, inactivity_timeout=5):
        if method is None:
            break
        channel.basic_ack(method.delivery_tag)
        got += 1
        if got == messages:
            break
    channel.cancel()
    connection.close()


def unacked_buildup(name: str, context: ssl.SSLContext, queue: str, messages: int = 30) -> None:
    """A consumer that takes deliveries and never acks them, until it closes."""
    connection = pika_connection(name, context)
    channel = connection.channel()
    channel.queue_declare(queue, auto_delete=False, arguments={"x-expires": 60_000})
    for number in range(messages):
        channel.basic_publish("", queue, b"job %d" % number)
    got = 0
    for method, _, _ in channel.consume(queue, inactivity_timeout=5):
        if method is None:
            break
        got += 1
        if got == messages:
            break
    connection.close()


def requeue_loop(name: str, context: ssl.SSLContext, queue: str, rounds: int = 15) -> None:
    """One message rejected with requeue again and again."""
    connection = pika_connection(name, context)
    channel = connection.channel()
    channel.queue_declare(queue, auto_delete=False, arguments={"x-expires": 60_000})
    channel.basic_publish("", queue, b"poison", pika.BasicProperties(message_id=f"{name}-poison"))
    seen = 0
    for method, _, _ in channel.consume(queue, inactivity_timeout=5):
        if method is None:
            break
        seen += 1
        channel.basic_nack(method.delivery_tag, requeue=seen < rounds)
        if seen == rounds:
            break
    channel.cancel()
    connection.close()


def aio_clean_traffic(name: str, context: ssl.SSLContext, queue: str, messages: int = 20) -> None:
    """The second client library: aio-pika publishes with confirms and consumes with acks."""
    async def run() -> None:
        connection = await aio_pika.connect(host=HOST, port=TLS_PORT, login=USER, password=PASSWORD, ssl=True,
                                            ssl_context=context, client_properties={"connection_name": name})
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            declared = await channel.declare_queue(queue, arguments={"x-expires": 60_000})
            for number in range(messages):
                await channel.default_exchange.publish(aio_pika.Message(b"aio %d" % number), routing_key=queue)
            got = 0
            async with declared.iterator() as deliveries:
                async for message in deliveries:
                    await message.ack()
                    got += 1
                    if got == messages:
                        break
    asyncio.run(run())


def _frames(*items) -> bytes:
    from pamqp import frame
    return b"".join(frame.marshal(item, channel) for item, channel in items)


def _open_connection(send, client_properties: dict) -> None:
    from pamqp import commands
    send(b"AMQP\x00\x00\x09\x01")
    send(_frames((commands.Connection.StartOk(client_properties=client_properties, mechanism="PLAIN",
                                              response=f"\x00{USER}\x00{PASSWORD}", locale="en_US"), 0)))
    send(_frames((commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0), 0),
                 (commands.Connection.Open(virtual_host="/"), 0)))


def paced(sock):
    """A `send` for raw_conversation over a socket: the bytes, a pause for the broker to answer,
    and whatever it answered read and dropped."""
    def send(data: bytes) -> None:
        sock.sendall(data)
        time.sleep(0.15)
        sock.setblocking(False)
        try:
            while sock.recv(65536):
                pass
        except (ssl.SSLWantReadError, BlockingIOError):
            pass
        finally:
            sock.setblocking(True)
    return send


def raw_conversation(send, name: str, queue: str, messages: int = 10, key_updates: tuple[bytes, ...] = ()) -> None:
    """An AMQP conversation written frame by frame (pamqp), paced so the broker answers each step
    before the next; `send(b"K")`-style key update commands go between the phases when given."""
    from pamqp import body, commands, header
    _open_connection(send, {"connection_name": name, "product": "ackscope tls lab"})
    send(_frames((commands.Channel.Open(), 1),
                 (commands.Queue.Declare(queue=queue, arguments={"x-expires": 60_000}), 1)))
    phases = [b""] + list(key_updates)
    for phase, command in enumerate(phases):
        if command:
            send(command)
        items = []
        for number in range(messages):
            content = b"phase %d message %d" % (phase, number)
            items += [(commands.Basic.Publish(exchange="", routing_key=queue), 1),
                      (header.ContentHeader(body_size=len(content)), 1), (body.ContentBody(content), 1)]
        send(_frames(*items))
    send(_frames((commands.Basic.Consume(queue=queue, consumer_tag="c1"), 1)))
    send(_frames((commands.Basic.Ack(delivery_tag=messages * len(phases), multiple=True), 1)))
    send(_frames((commands.Basic.Cancel(consumer_tag="c1"), 1)))
    send(_frames((commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0)))


def openssl_key_updates(name: str, keylog: Path, queue: str, ciphersuite: str) -> None:
    """openssl s_client over TLS 1.3 with `ciphersuite`, sending KeyUpdates between the phases:
    one that asks the broker to update its keys too ('K'), one that does not ('k')."""
    client = subprocess.Popen(
        ["openssl", "s_client", "-connect", f"{HOST}:{TLS_PORT}", "-tls1_3", "-ciphersuites", ciphersuite,
         "-keylogfile", str(keylog), "-servername", "localhost", "-CAfile", CA],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def send(data: bytes) -> None:
        client.stdin.write(data)
        client.stdin.flush()
        time.sleep(0.3)  # s_client reads stdin in chunks: one chunk per step (its commands are a chunk's first letter)

    time.sleep(0.5)
    raw_conversation(send, name, queue, key_updates=(b"K\n", b"k\n"))
    client.stdin.close()
    client.wait(timeout=20)


def lost_confirms(name: str, context: ssl.SSLContext | None, exchange: str, burst: int = 30, queues: int = 40) -> None:
    """A publisher in confirm mode sends a burst of persistent messages to a fanout of durable queues
    and resets its TCP connection at once (tests/lab/scenarios/lost_confirms.py, over TLS or not)."""
    import socket
    from pamqp import body, commands, header
    setup = pika_connection(f"{name}-setup", context)
    channel = setup.channel()
    channel.exchange_declare(exchange, "fanout", auto_delete=True)
    for number in range(queues):
        queue = f"{exchange}-{number}"
        channel.queue_declare(queue, durable=True, arguments={"x-expires": 60_000})
        channel.queue_bind(queue, exchange)
    raw = socket.create_connection((HOST, TLS_PORT if context else PLAIN_PORT))
    sock = context.wrap_socket(raw, server_hostname="localhost") if context else raw
    send = paced(sock)
    _open_connection(send, {"connection_name": name, "capabilities": {"publisher_confirms": True}})
    send(_frames((commands.Channel.Open(), 1), (commands.Confirm.Select(), 1)))
    items = []
    for number in range(burst):
        content = b"order %d" % number
        items += [(commands.Basic.Publish(exchange=exchange, routing_key=""), 1),
                  (header.ContentHeader(body_size=len(content), properties=commands.Basic.Properties(
                      delivery_mode=2, message_id=f"{name}-{number}")), 1), (body.ContentBody(content), 1)]
    sent_then_reset(sock, lambda: sock.sendall(_frames(*items)))
    setup.close()


def resumed_sessions(name: str, keylog: Path, queue: str, version: str) -> None:
    """Two connections from Python's ssl, the second resuming the first's session (TLS 1.2: the
    session id; TLS 1.3: a ticket, PSK)."""
    import socket
    context = client_context(version, keylog)
    session = None
    for number in range(2):
        with socket.create_connection((HOST, TLS_PORT)) as raw:
            with context.wrap_socket(raw, server_hostname="localhost", session=session) as tls:
                raw_conversation(paced(tls), f"{name}-{number}", queue, messages=5)
                session = tls.session
                reused = tls.session_reused
    assert reused, "the second connection resumed the first one's session"
