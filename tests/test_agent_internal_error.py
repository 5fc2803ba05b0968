"""An internal error in the real agent process: /readyz and one log line say so, the rows already
whole are flushed, the row it cannot place is never written, and it exits non-zero for a restart.

The fault is planted from outside (tests/agent_faults.py): a row sink that loses a connection's
constants, as issue 62's bug did, so the agent's own RowSink.take meets a row it cannot place.
Beside it, what is not an internal error though Python raises it as no Exception: a panic in
delta-rs, a failed flush like any other."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from analyzer.cli import EXIT_AGENT_FAILED
from tests.agent_support import AgentProcess, lake_connections, lake_frames, publish_confirmed, rows_of, wait_for

pytestmark = pytest.mark.rabbitmq


def test_an_unplaced_row_stops_the_agent_after_a_flush_of_what_is_consistent(tmp_path):
    lake_dir = str(tmp_path / "lake")
    with AgentProcess(lake_dir, agent_id="faulty", relayed=True, flush_interval=0.5,
                      entry=("tests.agent_faults", "unplaced-row")) as agent:
        publish_confirmed("agent-test-placed", 5, port=agent.broker_port)  # the sink's first connection: kept
        assert wait_for(lambda: Counter(r["method"] for r in rows_of(lake_dir, "agent-test-placed"))
                        ["basic.publish"] == 5, timeout=30)
        assert agent.answer("/readyz") == (200, "capturing and flushing\n")
        publish_confirmed("agent-test-unplaced", 5, port=agent.broker_port)  # its constants are lost
        answers = []
        while agent.process.poll() is None and len(answers) < 500:
            try:
                answers.append(agent.answer("/readyz"))
            except OSError:  # the server is gone: the process is on its way out
                break
            time.sleep(0.02)
        out, err = agent.exited(60)
    assert agent.process.returncode == EXIT_AGENT_FAILED, err
    failing = [reason for status, reason in answers if status == 503]
    assert failing and failing[-1].startswith("internal error, exiting to be restarted: UnplacedRow: "), answers[-3:]
    said = [line for line in err.splitlines() if "internal error" in line]
    assert len(said) == 1 and "UnplacedRow" in said[0], err
    report = __import__("json").loads(out)
    assert report["internal_error"].startswith("UnplacedRow: ")
    # What was whole is in the lake once; nothing of the connection it could not place.
    frames = lake_frames(lake_dir, ["connection_id", "seq", "client_port"]).to_pylist()
    assert len({(r["connection_id"], r["seq"]) for r in frames}) == len(frames)
    placed = rows_of(lake_dir, "agent-test-placed")
    assert Counter(r["method"] for r in placed)["basic.publish"] == 5
    assert {r["connection_id"] for r in frames} == {r["connection_id"] for r in placed}
    assert [c["connection_name"] for c in lake_connections(lake_dir).to_pylist()] == ["agent-test-placed"]


def test_a_panic_in_delta_rs_after_its_commit_landed_is_a_failed_flush_and_adds_nothing_twice(tmp_path):
    """pyo3 raises a Rust panic as a BaseException: the sink counts it as a failed flush and goes on
    (before, it ended the sink's thread and the capture went on with nothing flushed again)."""
    lake_dir = str(tmp_path / "lake")
    with AgentProcess(lake_dir, agent_id="panicked", relayed=True, flush_interval=0.5,
                      entry=("tests.agent_faults", "lake-panic")) as agent:
        publish_confirmed("agent-test-before-panic", 5, port=agent.broker_port)
        assert wait_for(lambda: agent.value("ackscope_agent_flushes_total", outcome="error") == 1), agent.describe()
        publish_confirmed("agent-test-after-panic", 5, port=agent.broker_port)
        assert wait_for(lambda: len(rows_of(lake_dir, "agent-test-after-panic")) > 0), agent.describe()
        assert agent.answer("/readyz") == (200, "capturing and flushing\n")
        report = agent.stop()
    assert report["flushes"]["error"] == 1 and report["flushes"]["ok"] >= 1 and "internal_error" not in report
    frames = lake_frames(lake_dir, ["connection_id", "seq"]).to_pylist()
    assert len({(r["connection_id"], r["seq"]) for r in frames}) == len(frames)  # the landed commit not redone
    for name in ("agent-test-before-panic", "agent-test-after-panic"):
        assert Counter(r["method"] for r in rows_of(lake_dir, name))["basic.publish"] == 5, name
    said = [line for line in agent.stderr.splitlines() if "PanicException" in line]
    assert len(said) == 1 and "flush to" in said[0], agent.stderr
