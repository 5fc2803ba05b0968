"""Runs scenarios: traffic, recording, verification, and the files a run leaves behind."""

from __future__ import annotations

import fcntl
import json
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from tests.lab.capture import read_capture
from tests.lab.errors import LabError, NotObserved
from tests.lab.evidence import all_evidence
from tests.lab.expectations import expectations_document
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario

ATTEMPTS = 3
# Two lab runs at once would record each other, and flow_control blocks the whole broker.
LOCK_FILE = Path(tempfile.gettempdir()) / "ackscope-lab.lock"


def run_scenarios(scenarios: list[Scenario], out_dir: Path) -> list[str]:
    """Record every scenario into out_dir; return the failures (an empty list if none)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    failures = []
    with exclusive_lab():
        for scenario in scenarios:
            started = time.monotonic()
            try:
                capture_path = run_scenario(scenario, out_dir)
            except (LabError, NotObserved) as failure:
                failures.append(f"{scenario.name}: {failure}")
                report(f"{scenario.name}: FAILED: {failure}")
            except Exception as crash:  # a client library error: this scenario fails, the others still run
                failures.append(f"{scenario.name}: crashed: {crash!r}")
                report(f"{scenario.name}: CRASHED:\n{traceback.format_exc()}")
            else:
                report(f"{scenario.name}: recorded {capture_path} ({capture_path.stat().st_size // 1024} KiB, "
                       f"{time.monotonic() - started:.1f}s)")
    return failures


def run_scenario(scenario: Scenario, out_dir: Path) -> Path:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return record_once(scenario, out_dir)
        except NotObserved as missed:
            report(f"{scenario.name}: attempt {attempt} of {ATTEMPTS}: not observed: {missed}")
            last_miss = missed
    raise NotObserved(f"not observed in {ATTEMPTS} attempts (the last capture is kept as "
                      f"{failed_capture_path(out_dir, scenario)}); last: {last_miss}")


def record_once(scenario: Scenario, out_dir: Path) -> Path:
    capture_path = out_dir / f"{scenario.name}.pcapng"
    expected_path = out_dir / f"{scenario.name}.expected.json"
    # Never leave expectations beside another run's capture, nor a capture without them.
    for stale in (expected_path, capture_path, failed_capture_path(out_dir, scenario)):
        stale.unlink(missing_ok=True)
    try:
        return _record_and_judge(scenario, capture_path, expected_path)
    except NotObserved:
        if capture_path.exists():
            capture_path.rename(failed_capture_path(out_dir, scenario))
        raise


def failed_capture_path(out_dir: Path, scenario: Scenario) -> Path:
    return out_dir / f"{scenario.name}.failed.pcapng"


def _record_and_judge(scenario: Scenario, capture_path: Path, expected_path: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="ackscope-lab-") as workdir:
        lab = Lab(scenario.name, Path(workdir))
        try:
            scenario.drive(lab)
        finally:
            lab.cleanup()
        if not lab.recording.fence_ports:
            raise LabError(f"{scenario.name} never started its recording")
        lab.recording.keep_streams(capture_path, connection_name(scenario.name, ""), set(lab.names_by_port))
    capture = read_capture(capture_path, lab.names_by_port)
    evidence = all_evidence(capture)
    verdict = scenario.judge(capture, evidence)
    connections = {s.connection_name: s.client_port for s in capture.streams.values() if s.connection_name}
    document = expectations_document(scenario.name, scenario.description, verdict, evidence, connections)
    expected_path.write_text(json.dumps(document, indent=2) + "\n")
    return capture_path


@contextmanager
def exclusive_lab():
    with LOCK_FILE.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def report(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
