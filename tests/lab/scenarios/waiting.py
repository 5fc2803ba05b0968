"""Bounded waiting, the same for every scenario: on a busy machine a wait that runs out is a
scenario that did not happen (NotObserved, so it is tried again), never a hang."""

from __future__ import annotations

import time

from tests.lab.errors import NotObserved


class Deadline:
    def __init__(self, seconds: float, waiting_for: str):
        self.end = time.monotonic() + seconds
        self.waiting_for = waiting_for

    def check(self) -> None:
        if time.monotonic() >= self.end:
            raise NotObserved(f"timed out waiting for {self.waiting_for}")


def pump_pika_until(connection, condition, seconds: float, waiting_for: str) -> None:
    """Let a pika BlockingConnection process frames until `condition()` holds."""
    deadline = Deadline(seconds, waiting_for)
    while not condition():
        deadline.check()
        connection.process_data_events(time_limit=0.05)


def drain_amqp_until(connection, condition, seconds: float, waiting_for: str) -> None:
    """Let a py-amqp Connection process frames until `condition()` holds."""
    deadline = Deadline(seconds, waiting_for)
    while not condition():
        deadline.check()
        try:
            connection.drain_events(timeout=0.05)
        except TimeoutError:
            pass
