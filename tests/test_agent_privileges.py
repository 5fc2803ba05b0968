"""The agent as a non-root user with CAP_NET_RAW only (docs/agent.md, "Privileges"): it captures and
writes its lake; without the capability it stops at once, naming the capability it lacks. The tests
run as root; setpriv makes the agent's process user nobody with exactly the capabilities given."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

import pytest

from tests.agent_support import (CAP_NET_RAW, NOBODY, AgentProcess, folder_for_nobody, process_credentials,
                                 publish_confirmed, rows_of, run_as_nobody, wait_for)

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def nobody_dir():
    """A working folder for the unprivileged agent outside pytest's root-only tmp folders."""
    made = []

    def make(name: str, owner: str = NOBODY) -> str:
        folder = folder_for_nobody(tempfile.gettempdir(), name, owner)
        made.append(os.path.dirname(folder))
        return folder

    yield make
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def test_as_nobody_with_only_cap_net_raw_the_agent_captures_into_its_lake(nobody_dir):
    lake_dir = nobody_dir("lake")
    run_as = run_as_nobody(os.path.dirname(lake_dir))
    with AgentProcess(lake_dir, agent_id="nobody", flush_interval=0.5, run_as=run_as, relayed=True) as agent:
        credentials = process_credentials(agent.process.pid)
        assert credentials["Uid"].split() == ["65534"] * 4  # real, effective, saved, filesystem
        assert int(credentials["CapEff"], 16) == 1 << CAP_NET_RAW
        assert int(credentials["CapPrm"], 16) == 1 << CAP_NET_RAW
        publish_confirmed("agent-test-nobody", 12, port=agent.broker_port)
        assert wait_for(lambda: agent.value("ackscope_agent_frames_total", method="basic.ack") >= 12)
        report = agent.stop()
    assert report["kernel_drops"] == 0 and set(report["flushes"]) == {"ok"}
    methods = Counter(r["method"] for r in rows_of(lake_dir, "agent-test-nobody"))
    assert methods["basic.publish"] == 12 and methods["basic.ack"] == 12
    owners = {os.stat(os.path.join(root, name)).st_uid for root, _, files in os.walk(lake_dir) for name in files}
    assert owners == {65534}  # written by the unprivileged process itself


def test_without_cap_net_raw_the_agent_stops_naming_the_missing_capability(nobody_dir):
    lake_dir = nobody_dir("lake")
    run_as = run_as_nobody(os.path.dirname(lake_dir), caps=())
    run = subprocess.run([*run_as, sys.executable, "-m", "analyzer.cli", "capture", "--iface", "lo",
                          "--lake", lake_dir, "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "CAP_NET_RAW" in run.stderr and "Traceback" not in run.stderr
    assert run.stdout == "" and os.listdir(lake_dir) == []
