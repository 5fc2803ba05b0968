"""Captures in pieces recorded live (issue 61): lab scenarios against the real RabbitMQ recorded at
once by the lab's single-file dumpcap and by a dumpcap ring buffer (`-b filesize:` and `-b
duration:`), and the agent's own `--pcap-out` rotation. The ring's files, ingested as one capture
or one ingest per file, give the scenario's connections the single file's frame rows and
connection rows; on one scenario `ackscope analyze` then finds the same."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import time

import pytest

from analyzer import lake, schema
from analyzer.ingest import ingest_files
from tests.agent_support import AgentProcess, publish_confirmed
from tests.findings_check import analysed_as_the_command_does
from tests.pieces_support import packet_count
from tests.lab import broker
from tests.lab.lab import Lab, connection_name
from tests.lab.recording import start_dumpcap, stop_dumpcap
from tests.lab.runner import exclusive_lab
from tests.lab.scenarios import SCENARIOS

pytestmark = pytest.mark.rabbitmq
RINGS = {  # scenario -> dumpcap's ring option
    "lost_confirms": "filesize:24",
    "requeue_loop": "filesize:12",
    "unacked_buildup": "duration:1",
}


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> dict:
    """scenario -> (the lab's single-file raw capture, the ring's files oldest first)."""
    out = {}
    with exclusive_lab():
        for scenario, option in RINGS.items():
            workdir = tmp_path_factory.mktemp(scenario)
            ring_dir = workdir / "ring"
            ring_dir.mkdir()
            ring = start_dumpcap("-f", f"tcp port {broker.PORT}", "-b", option, "-w", str(ring_dir / "ring.pcapng"))
            lab = Lab(scenario, workdir)
            try:
                SCENARIOS[scenario].drive(lab)
            finally:
                lab.cleanup()
                stop_dumpcap(ring)
            out[scenario] = (str(lab.recording.raw_path), sorted(glob.glob(str(ring_dir / "ring_*.pcapng"))))
    return out


TIMES = ("ts", "ts_ns", "date", "first_ts", "first_ts_ns", "last_ts", "last_ts_ns")


def scenario_tables(lake_dir: str, scenario: str, ids: set[str] | None = None, times: bool = True) -> tuple[list, list]:
    """Frame rows and connection rows of the scenario's named connections (or of `ids`), with the
    columns that name the file (source, source_packet) left out. `times=False`: without packet
    times, and the connection id without its first packet's time, for two dumpcaps that recorded
    the same packets (each of their sockets stamps its own time, some hundred ns apart)."""
    connections = lake.read_table(lake_dir, "connections", schema.CONNECTIONS).to_pylist()
    if ids is None:
        prefix = connection_name(scenario, "")
        ids = {c["connection_id"] for c in connections if (c["connection_name"] or "").startswith(prefix)}

    def kept(row: dict, drop: tuple) -> dict:
        row = {k: v for k, v in row.items() if k not in drop and (times or k not in TIMES)}
        if not times:
            row["connection_id"] = row["connection_id"].rsplit("@", 1)[0]
        return row

    chosen = sorted((kept(c, ("source",)) for c in connections if c["connection_id"] in ids),
                    key=lambda c: c["connection_id"])
    frames = lake.read_table(lake_dir, "frames", schema.FRAMES).to_pylist()
    chosen_frames = sorted((kept(r, ("source", "source_packet")) for r in frames if r["connection_id"] in ids),
                           key=lambda r: (r["connection_id"], r["seq"]))
    return chosen_frames, chosen


def ids_named(lake_dir: str, scenario: str) -> set[str]:
    prefix = connection_name(scenario, "")
    return {c["connection_id"] for c in lake.read_table(lake_dir, "connections", schema.CONNECTIONS).to_pylist()
            if (c["connection_name"] or "").startswith(prefix)}


def concatenated(ring: list[str], path: str) -> str:
    """The ring's files as one file, packet for packet (mergecap -a): the same run in one piece,
    times and all."""
    subprocess.run(["mergecap", "-a", "-w", path, *ring], check=True, capture_output=True, timeout=120)
    return path


@pytest.mark.parametrize("scenario", list(RINGS))
def test_a_dumpcap_ring_gives_the_single_files_rows(recordings, tmp_path, scenario):
    single, ring = recordings[scenario]
    assert len(ring) >= 3, f"the ring wrote {len(ring)} file(s): make its files smaller"
    one = ingest_files(ring, str(tmp_path / "one"))
    assert [r.errors for r in one] == [[] for _ in ring]
    for path in ring:  # as a scheduled job would, each file once it is closed
        assert not ingest_files([path], str(tmp_path / "scheduled"))[0].errors
    # The same packets in one file: every row equal, times and connection ids included.
    whole = concatenated(ring, str(tmp_path / "ring.pcapng"))
    assert not ingest_files([whole], str(tmp_path / "whole"))[0].errors
    ids = ids_named(str(tmp_path / "whole"), scenario)
    assert ids, "the scenario's connections are in the ring"
    expected = scenario_tables(str(tmp_path / "whole"), scenario, ids)
    assert scenario_tables(str(tmp_path / "one"), scenario, ids) == expected
    assert scenario_tables(str(tmp_path / "scheduled"), scenario, ids) == expected
    # The lab's own single-file dumpcap of the same run: the same rows but for the packets' times.
    assert not ingest_files([single], str(tmp_path / "single"))[0].errors
    by_lab = scenario_tables(str(tmp_path / "single"), scenario, times=False)
    assert by_lab[1] and scenario_tables(str(tmp_path / "scheduled"), scenario, ids, times=False) == by_lab


def findings_of(spark, lake_dir: str, ids: set[str], offsets: dict[str, int]) -> list[dict]:
    """The findings of these connections, each evidence packet numbered in the whole capture
    (`offsets`: file -> packets before it), so the ring's and the one file's compare whole."""
    analysed_as_the_command_does(spark, lake_dir)
    kept = []
    for finding in lake.read_table(lake_dir, "findings", schema.FINDINGS).to_pylist():
        if finding["connection_id"] not in ids:
            continue
        evidence = json.loads(finding.pop("evidence"))
        packets = evidence.pop("source_packets", [])
        files = evidence.pop("source_files", [finding.pop("source")] * len(packets))
        finding.pop("source", None)
        evidence["packets_in_the_whole"] = [p + offsets[f] for p, f in zip(packets, files)]
        kept.append({**finding, "evidence": evidence})
    return sorted(kept, key=lambda f: json.dumps(f, sort_keys=True, default=str))


def test_analysis_of_the_ring_finds_what_the_single_file_finds(spark, recordings, tmp_path):
    scenario = "lost_confirms"
    _, ring = recordings[scenario]
    ingest_files([concatenated(ring, str(tmp_path / "ring.pcapng"))], str(tmp_path / "single"))
    ids = ids_named(str(tmp_path / "single"), scenario)
    for path in ring:
        ingest_files([path], str(tmp_path / "ring"))
    expected = findings_of(spark, str(tmp_path / "single"), ids, {str(tmp_path / "ring.pcapng"): 0})
    assert any(f["kind"] == "lost_confirm" for f in expected)
    before = [sum(packet_count(path) for path in ring[:k]) for k in range(len(ring))]
    assert findings_of(spark, str(tmp_path / "ring"), ids, dict(zip(ring, before))) == expected


def test_the_agents_rotated_pcap_out_ingests_to_the_agents_rows(tmp_path):
    """`ackscope capture --pcap-out` with rotation: its files, ingested in order, give the rows the
    agent itself wrote for the same connections."""
    rotated, agent_lake = tmp_path / "rotated", str(tmp_path / "agent")
    name = f"pieces-rotation-{os.getpid()}"
    with AgentProcess(agent_lake, agent_id="rot", flush_interval=0.3, relayed=True,
                      extra=("--pcap-out", str(rotated), "--rotate-size", "0.004", "--rotate-keep", "1000")) as agent:
        publish_confirmed(name, 120, port=agent.broker_port)
        time.sleep(1.0)
        report = agent.stop()
        port = agent.broker_port
    files = report["pcap_files"]
    assert len(files) >= 3, files
    ingested = str(tmp_path / "ingested")
    reports = ingest_files(files, ingested, agent_id="rot", broker_ports=(port,))
    assert [r.errors for r in reports] == [[] for _ in files]
    agent_connections = lake.read_table(agent_lake, "connections", schema.CONNECTIONS).to_pylist()
    ids = {c["connection_id"] for c in agent_connections if c["connection_name"] == name}
    assert ids
    (frames, connections), (agent_frames, agent_connections) = (scenario_tables(ingested, "", ids),
                                                                 scenario_tables(agent_lake, "", ids))
    # The files' passwords are zeroed (--pcap-out's default, issue 60), PLAIN's user name kept:
    # every column round-trips.
    assert {c["user"] for c in connections} == {c["user"] for c in agent_connections} == {"guest"}
    assert (frames, connections) == (agent_frames, agent_connections)
    shutil.rmtree(rotated)
