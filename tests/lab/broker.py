"""The real RabbitMQ the lab drives: where it is, and what only rabbitmqctl can do to it."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import struct
import subprocess
from collections.abc import Callable
from contextlib import contextmanager

from tests.lab.errors import LabError

HOST, PORT, USER, PASSWORD = "127.0.0.1", 5672, "guest", "guest"
# The broker's default; DESIGN.md's machines run with it, and the lab always goes back to it.
NORMAL_MEMORY_WATERMARK = "0.4"
# Low enough that any running broker is over it: the memory alarm goes off at once.
ALARM_MEMORY_WATERMARK = "0.000001"


def rabbitmqctl(*args: str, timeout: float = 60) -> str:
    try:
        result = subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as missing:
        raise LabError("rabbitmqctl is not installed (apt-get install rabbitmq-server)") from missing
    if result.returncode != 0:
        raise LabError(f"rabbitmqctl {' '.join(args)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def user_with_fresh_password(user: str, prefix: str) -> str:
    """`user` on vhost / with every permission and a new random password starting with `prefix`
    (set again if the user exists), returned: it appears nowhere else, so finding it in a file
    means something."""
    password = prefix + secrets.token_hex(12)
    existing = rabbitmqctl("list_users", "--quiet", "--no-table-headers")
    if user in [line.split("\t")[0] for line in existing.splitlines()]:
        rabbitmqctl("change_password", user, password)
    else:
        rabbitmqctl("add_user", user, password)
    rabbitmqctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
    return password


def connection_pid(connection_name: str) -> str:
    """The pid of the open connection with this connection_name, as close_connection takes it
    (the table form; the JSON form shows pids as '#PID<...>')."""
    for row in rabbitmqctl("list_connections", "pid", "client_properties", "--quiet",
                           "--no-table-headers").splitlines():
        pid, _, properties = row.partition("\t")
        if f'{{"connection_name","{connection_name}"}}' in properties:
            return pid
    raise LabError(f"the broker has no open connection named {connection_name!r}")


def force_close_connection(pid: str, reason: str) -> None:
    """What an operator does with `rabbitmqctl close_connection`: the broker sends
    connection.close 320 CONNECTION_FORCED and drops the connection."""
    rabbitmqctl("close_connection", pid, reason)


@contextmanager
def memory_alarm():
    """Raise the broker-wide memory alarm, and always clear it again: while it is on, every
    publishing connection on the broker is blocked, not only the lab's."""
    rabbitmqctl("set_vm_memory_high_watermark", ALARM_MEMORY_WATERMARK)
    try:
        yield
    finally:
        rabbitmqctl("set_vm_memory_high_watermark", NORMAL_MEMORY_WATERMARK)


@contextmanager
def frozen():
    """The broker's VM stopped (SIGSTOP) while the block runs, and always let go again. The kernel
    still takes what clients send, and their resets, but the broker answers nothing: a client
    that writes publishes and resets inside the block has them unconfirmed on the wire however
    long a busy machine deschedules it between the two, where a broker left running would
    confirm them in the pause, within milliseconds."""
    found = subprocess.run(["pgrep", "-u", "rabbitmq", "-x", "beam.smp"], capture_output=True, text=True)
    pids = [int(pid) for pid in found.stdout.split()]
    if not pids:
        raise LabError("no beam.smp of user rabbitmq to stop: is rabbitmq-server running?")
    stopped = []
    try:
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        except PermissionError as refused:
            raise LabError(f"cannot stop the broker's VM (run the tests as root, as CI does): {refused}") from refused
        yield
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


def sent_then_reset(sock: socket.socket, send: Callable[[], None]) -> None:
    """`send()` (publishes, say), then `sock` reset (SO_LINGER 0: close() sends RST at once, without
    waiting for the confirms on their way), the broker frozen across the two: whatever `send` wrote
    is on the wire unanswered, however long a busy machine holds the client in between."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with frozen():
        send()
        sock.close()
