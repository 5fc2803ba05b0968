"""An idle connection that negotiated a 1 s heartbeat: both sides send heartbeat frames
while nothing else happens."""

from __future__ import annotations

from tests.lab.clients import pika_connection
from tests.lab.expectations import Verdict, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario

NAME = "heartbeats"
IDLE = connection_name(NAME, "idle")
HEARTBEAT_SECONDS, IDLE_SECONDS = 1, 3.5


def drive(lab: Lab) -> None:
    with lab.recorded(), pika_connection(IDLE, heartbeat=HEARTBEAT_SECONDS) as connection:
        connection.channel()
        connection.sleep(IDLE_SECONDS)  # pika sends and checks heartbeats while it sleeps


def judge(capture, evidence) -> Verdict:
    tune_ok = capture.methods("connection.tune-ok", from_broker=False, connection_name=IDLE)
    require(bool(tune_ok) and tune_ok[0].args["heartbeat"] == str(HEARTBEAT_SECONDS),
            f"heartbeat {HEARTBEAT_SECONDS} agreed in connection.tune-ok")
    counts = {side: len(capture.heartbeats(from_broker=side == "broker", connection_name=IDLE))
              for side in ("broker", "client")}
    require(min(counts.values()) >= 2, f"at least 2 heartbeat frames each way, saw {counts}")
    return Verdict(expect=[], facts={"heartbeat_seconds": HEARTBEAT_SECONDS, "heartbeat_frames": counts})


SCENARIO = Scenario(
    name=NAME,
    description=("pika connection negotiates heartbeat=1 and stays idle for 3.5 s with one open channel: "
                 "heartbeat frames from both sides, nothing else. Nothing to flag."),
    drive=drive,
    judge=judge,
)
