"""Connection churn of issue 62's shape, for the churn test and the soak benchmark (bench/soak.py).

Short connections open at `connections_per_s`, each publishes `messages` confirmed messages to an
exclusive queue of its own, reads them back (basic.get) and acks them, and closes; every
`reset_every`-th reads them without acking and dies with a reset (SO_LINGER 0, so its unacked
messages are redelivered to nobody and its open state ends by tcp.rst). Beside them,
`publishers` long-lived confirm-mode publishers send `publisher_rate` messages a second each.

Every client counts the basic.publish frames it sent, by its connection_name: what the agent's
lake must hold, each exactly once, under that connection. Clients are pika threads in this process.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections import Counter

import pika

from tests.lab.clients import pika_connection


class Churn:
    def __init__(self, port: int, prefix: str, *, connections_per_s: float = 5.0, messages: int = 20,
                 reset_every: int = 20, publishers: int = 2, publisher_rate: float = 100.0,
                 max_open: int = 40):
        self.port, self.prefix = port, prefix
        self.connections_per_s, self.messages, self.reset_every = connections_per_s, messages, reset_every
        self.publishers, self.publisher_rate = publishers, publisher_rate
        self.sent: Counter = Counter()        # connection_name -> basic.publish frames sent
        self.client_ports: dict[str, int] = {}  # connection_name -> the client's local port
        self.errors: list[str] = []
        self.opened = self.resets = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._room = threading.Semaphore(max_open)  # a slow broker must not pile up threads
        self._threads: list[threading.Thread] = []

    def start(self) -> "Churn":
        for n in range(self.publishers):
            self._spawn(self._long_publisher, f"{self.prefix}-steady-{n}")
        self._spawn(self._opener)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            self.errors.append(f"{len(stuck)} client thread(s) still running after {timeout:.0f}s")

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=self._guarded, args=(target, *args), daemon=True,
                                  name=args[0] if args else "churn-opener")
        self._threads.append(thread)
        thread.start()

    def _guarded(self, target, *args) -> None:
        try:
            target(*args)
        except Exception as exc:  # a client's failure is the run's failure: reported, never silent
            with self._lock:
                self.errors.append(f"{args[0] if args else 'opener'}: {type(exc).__name__}: {exc}")

    def _opener(self) -> None:
        every = 1.0 / self.connections_per_s
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._room.acquire()
            self.opened += 1
            number = self.opened
            self._threads = [t for t in self._threads if t.is_alive()]
            self._spawn(self._short, f"{self.prefix}-short-{number}", number % self.reset_every == 0)
            next_at += every
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _connect(self, name: str) -> pika.BlockingConnection:
        connection = pika_connection(name, port=self.port, heartbeat=0)
        with self._lock:
            self.client_ports[name] = _socket_of(connection).getsockname()[1]
        return connection

    def _publish(self, channel, name: str, queue: str, number: int) -> None:
        with self._lock:
            self.sent[name] += 1  # counted before it goes: a publish that raises was still sent
        channel.basic_publish("", queue, b"churn %d" % number, pika.BasicProperties(message_id=f"{name}-{number}"))

    def _short(self, name: str, reset: bool) -> None:
        try:
            connection = self._connect(name)
            channel = connection.channel()
            channel.confirm_delivery()
            queue = channel.queue_declare("", exclusive=True).method.queue
            for number in range(self.messages):
                self._publish(channel, name, queue, number)
            for _ in range(self.messages):
                method, _, _ = channel.basic_get(queue)
                if method is not None and not reset:
                    channel.basic_ack(method.delivery_tag)
            if reset:
                # Dies as a crashed client does: the kernel sends RST, nothing more of AMQP.
                sock = _socket_of(connection)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
                with self._lock:
                    self.resets += 1
            else:
                connection.close()
        finally:
            self._room.release()

    def _long_publisher(self, name: str) -> None:
        connection = self._connect(name)
        channel = connection.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare("", exclusive=True, arguments={"x-max-length": 1000}).method.queue
        started, sent = time.monotonic(), 0
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.publisher_rate)
            while sent < due and not self._stop.is_set():
                self._publish(channel, name, queue, sent)
                sent += 1
            self._stop.wait(0.01)
        connection.close()


def _socket_of(connection: pika.BlockingConnection) -> socket.socket:
    # pika keeps its socket private; the churn needs it for the client's port and for a reset.
    return connection._impl._transport._sock
