"""/readyz and a failing lake, with the real agent on loopback: a lake folder the agent may not write
(permission denied) is reported once, answered 503 with the reason, keeps the rows it captured and
commits them when the folder becomes writable; a capture loop that stops turning is 503 too."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import threading
from collections import Counter

import pytest

from analyzer import lake
from analyzer.agent.run import Agent, AgentConfig
from tests.agent_support import (NOBODY, AgentProcess, folder_for_nobody, free_port, probe, publish_confirmed,
                                 rows_of, run_as_nobody, wait_for)

pytestmark = pytest.mark.rabbitmq


def test_a_lake_it_may_not_write_is_503_with_the_reason_and_loses_no_rows():
    # As root the agent could write anywhere: it runs as nobody (CAP_NET_RAW only) on a root-owned lake.
    lake_dir = folder_for_nobody(tempfile.gettempdir(), "lake", owner="root")
    try:
        with AgentProcess(lake_dir, agent_id="denied", flush_interval=0.3,
                          run_as=run_as_nobody(os.path.dirname(lake_dir))) as agent:
            publish_confirmed("agent-test-denied", 20)
            assert wait_for(lambda: agent.answer("/readyz")[0] == 503, timeout=30)
            status, reason = agent.answer("/readyz")
            assert "flushes to the lake failed" in reason and "Permission denied" in reason, reason
            assert agent.status("/healthz") == 200  # alive: no crash, no restart loop
            assert agent.value("ackscope_agent_flushes_total", outcome="error") >= 3
            assert agent.value("ackscope_agent_frames_total", method="basic.publish") >= 20  # capture goes on
            assert agent.value("ackscope_agent_buffered_rows") > 0
            assert agent.value("ackscope_agent_rows_dropped_total") == 0  # kept, not dropped
            assert lake.open_table(lake_dir, "frames") is None
            nobody = pwd.getpwnam(NOBODY)
            os.chown(lake_dir, nobody.pw_uid, nobody.pw_gid)  # the operator fixes the folder
            assert wait_for(lambda: agent.status("/readyz") == 200, timeout=30)
            assert agent.answer("/readyz")[1].strip() == "capturing and flushing"
            report = agent.stop()
        assert report["flushes"]["error"] >= 3 and report["flushes"]["ok"] >= 1 and report["rows_dropped"] == {}
        methods = Counter(r["method"] for r in rows_of(lake_dir, "agent-test-denied"))
        assert methods["basic.publish"] == 20 and methods["basic.ack"] == 20  # captured while failing
        log = [line for line in agent.stderr.splitlines() if "flush to" in line]
        assert len(log) == 2, log  # once when it started failing, once when it recovered: not every flush
        assert "Permission denied" in log[0] and "succeeded again after" in log[1]
    finally:
        shutil.rmtree(os.path.dirname(lake_dir), ignore_errors=True)


def test_readyz_is_503_while_the_capture_loop_stalls_and_200_once_it_turns_again(tmp_path):
    """The agent in this process, its capture loop on a thread: holding the state lock (what a decode
    or scrape that never returns would do) stops the loop at its next tick."""
    port = free_port()
    agent = Agent(AgentConfig(iface="lo", lake=str(tmp_path / "lake"), metrics_addr=("127.0.0.1", port),
                              agent_id="stall"))
    loop = threading.Thread(target=agent._capture_loop, daemon=True)
    loop.start()
    try:
        assert wait_for(lambda: probe(port, "/readyz")[0] == 200, timeout=10)
        with agent.state.lock:
            assert wait_for(lambda: probe(port, "/readyz")[0] == 503, timeout=20)
            status, reason = probe(port, "/readyz")
            assert reason.startswith("capture loop stalled for"), reason
            assert probe(port, "/healthz")[0] == 200
        assert wait_for(lambda: probe(port, "/readyz")[0] == 200, timeout=10)
    finally:
        agent.stopping.set()
        loop.join(timeout=10)
        agent.capture.close()
        agent.server.shutdown()
    assert not loop.is_alive()
