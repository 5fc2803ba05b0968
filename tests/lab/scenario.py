"""A lab scenario: the traffic it drives, and what its capture must then show."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tests.lab.capture import Capture
from tests.lab.expectations import EvidenceByKind, Verdict
from tests.lab.lab import Lab


@dataclass(frozen=True)
class Scenario:
    name: str
    # Says which client library drives the traffic: clients differ in how they batch frames.
    description: str
    # Runs the traffic against the broker; records it inside `with lab.recorded():`.
    drive: Callable[[Lab], None]
    # Checks the capture shows the scenario's point (raising NotObserved if not) and says what
    # an analysis must find.
    judge: Callable[[Capture, EvidenceByKind], Verdict]
