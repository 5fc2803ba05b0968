"""amqps end to end with real parts: the broker's TLS listener (deploy/ci/services.sh), clients
writing their key logs (pika over TLS 1.2 and 1.3, aio-pika, openssl s_client sending KeyUpdates,
Python's ssl resuming a TLS 1.2 session), dumpcap on lo, `ackscope ingest --tls-keylog`, and
tshark with the same key log as the oracle for the frames."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from analyzer import lake, native, schema
from analyzer.tls.keylog import read_keylog
from tests import tls_lab
from tests.conftest import needs_built
from tests.findings_check import analysed_as_the_command_does
from tests.tshark import frames_by_method

pytestmark = [pytest.mark.rabbitmq, pytest.mark.tshark]
REPOSITORY = Path(__file__).resolve().parent.parent
MARKER = "a11ce5ec2e7a11ce" * 6  # a secret-shaped marker: 48 bytes in hex


def ackscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyzer.cli", *args], capture_output=True, text=True,
                          cwd=REPOSITORY, timeout=600)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """One capture of every client and case, with the key log of all but the `nokey` connection."""
    out = tmp_path_factory.mktemp("tls")
    keylog, other_keylog = out / "keys.log", out / "other-app.log"
    run = uuid.uuid4().hex[:8]
    names = {}

    def name(case: str) -> str:
        names[case] = f"tls-lab-{case}-{run}"
        return names[case]

    ctx = tls_lab.client_context
    with tls_lab.recorded(out / "tls.pcapng"):
        tls_lab.clean_traffic(name("clean13"), ctx("1.3", keylog), f"tls-clean13-{run}")
        tls_lab.clean_traffic(name("clean12"), ctx("1.2", keylog), f"tls-clean12-{run}")
        tls_lab.clean_traffic(name("cbc12"), ctx("1.2", keylog, "ECDHE-RSA-AES128-SHA256"), f"tls-cbc12-{run}")
        tls_lab.unacked_buildup(name("unacked13"), ctx("1.3", keylog), f"tls-unacked13-{run}")
        tls_lab.unacked_buildup(name("unacked12"), ctx("1.2", keylog), f"tls-unacked12-{run}")
        tls_lab.requeue_loop(name("requeue13"), ctx("1.3", keylog), f"tls-requeue13-{run}")
        tls_lab.requeue_loop(name("requeue12"), ctx("1.2", keylog), f"tls-requeue12-{run}")
        tls_lab.aio_clean_traffic(name("aio13"), ctx("1.3", keylog), f"tls-aio13-{run}")
        tls_lab.aio_clean_traffic(name("aio12"), ctx("1.2", keylog), f"tls-aio12-{run}")
        tls_lab.openssl_key_updates(name("keyupdate"), keylog, f"tls-ku-{run}", "TLS_CHACHA20_POLY1305_SHA256")
        tls_lab.openssl_key_updates(name("aes128"), keylog, f"tls-aes128-{run}", "TLS_AES_128_GCM_SHA256")
        tls_lab.resumed_sessions(name("resumed12"), keylog, f"tls-resumed-{run}", "1.2")
        tls_lab.clean_traffic(name("nokey"), ctx("1.3", other_keylog), f"tls-nokey-{run}")
    os.chmod(keylog, 0o600)
    return out, keylog, other_keylog, names


@pytest.fixture(scope="module")
def ingested(recording):
    out, keylog, _, names = recording
    result = ackscope("ingest", str(out / "tls.pcapng"), "--lake", str(out / "lake"), "--tls-keylog", str(keylog),
                      "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), out / "lake"


def connections_by_name(lake_dir: Path, names: dict) -> dict:
    rows = lake.read_table(str(lake_dir), "connections", schema.CONNECTIONS).to_pylist()
    by_name = {row["connection_name"]: row for row in rows}
    return {case: by_name.get(full) for case, full in names.items()}


def test_frames_by_method_equal_tsharks_with_the_same_key_log(recording, ingested):
    out, keylog, _, _ = recording
    report, _ = ingested
    oracle = frames_by_method(str(out / "tls.pcapng"), tls_keylog=str(keylog))
    assert report["frames_by_method"] == dict(sorted(oracle.items()))
    assert oracle["basic.publish"] >= 200 and oracle["basic.nack"] >= 20  # the scenarios' traffic was decrypted


def test_each_connection_says_its_tls_version_suite_and_sni(recording, ingested):
    _, _, _, names = recording
    _, lake_dir = ingested
    rows = connections_by_name(lake_dir, {k: v for k, v in names.items() if k not in ("nokey", "resumed12")})
    expected = {"clean13": "TLS_AES_256_GCM_SHA384", "clean12": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
                "cbc12": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", "keyupdate": "TLS_CHACHA20_POLY1305_SHA256",
                "aes128": "TLS_AES_128_GCM_SHA256"}
    for case, row in rows.items():
        assert row is not None, f"{case}: no decrypted connection named {names[case]}"
        assert row["protocol"] == "amqp-0-9-1" and row["tls_decrypted"] is True and row["tls_note"] is None, case
        assert row["tls_version"] == ("TLSv1.3" if "13" in case or case in ("keyupdate", "aes128") else "TLSv1.2"), case
        # aio-pika connects by IP address, and TLS names no IP address in SNI
        assert row["tls_sni"] == (None if case.startswith("aio") else "localhost"), case
        if case in expected:
            assert row["tls_cipher_suite"] == expected[case], case
        assert row["user"] == "guest" and row["server_port"] == 5671


def test_key_updates_and_a_resumed_session_decrypt_to_the_end(recording, ingested):
    out, keylog, _, names = recording
    _, lake_dir = ingested
    updates = subprocess.run(["tshark", "-r", str(out / "tls.pcapng"), "-o", f"tls.keylog_file:{keylog}",
                              "-Y", "tls.handshake.type == 24", "-T", "fields", "-e", "tcp.srcport"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert len(updates) >= 6  # 'K' (and the broker's answer) and 'k', on two connections
    frames = lake.read_table(str(lake_dir), "frames", schema.FRAMES, columns=["connection_id", "method"])
    rows = connections_by_name(lake_dir, names)
    per_connection = Counter(zip(frames["connection_id"].to_pylist(), frames["method"].to_pylist()))
    for case in ("keyupdate", "aes128"):  # 10 publishes before, between and after the two KeyUpdates
        assert per_connection[(rows[case]["connection_id"], "basic.publish")] == 30, case
        assert per_connection[(rows[case]["connection_id"], "connection.close-ok")] == 1, case
    resumed = [row for name, row in connections_by_name(lake_dir, {
        n: f"{names['resumed12']}-{n}" for n in range(2)}).items()]
    for row in resumed:
        assert row["tls_decrypted"] and per_connection[(row["connection_id"], "connection.close-ok")] == 1


@needs_built(native.available(), "the native lane is not built (pip install -e . compiles analyzer/_lane.c)")
def test_the_native_lane_decodes_every_case_as_the_python_path_does(recording, monkeypatch):
    """KeyUpdates (from the client, and the broker's answer), a CBC suite, resumed sessions,
    aio-pika's and pika's records, a connection without its key: the lane, which takes a TLS
    connection past its handshake, against the pure-Python path on the same capture."""
    from tests.test_native_lane import assert_same_both_ways

    out, keylog, _, _ = recording
    (_, summary, _), taken = assert_same_both_ways(str(out / "tls.pcapng"), monkeypatch, read_keylog(str(keylog)))
    assert taken > 0.2 * summary["packets"]


def test_without_its_key_a_connection_is_tls_not_decrypted_and_counted(recording, ingested):
    _, _, _, names = recording
    report, lake_dir = ingested
    assert report["tls_not_decrypted"] == {"no key for that client random": 1}
    assert report["files"][0]["tls_connections"] == report["tls_connections"] >= 14
    rows = lake.read_table(str(lake_dir), "connections", schema.CONNECTIONS).to_pylist()
    hidden = [row for row in rows if row["protocol"] == "tls"]
    assert len(hidden) == 1 and hidden[0]["tls_decrypted"] is False and hidden[0]["connection_name"] is None
    assert hidden[0]["tls_version"] == "TLSv1.3" and hidden[0]["bytes_to_broker"] > 0
    frames = lake.read_table(str(lake_dir), "frames", schema.FRAMES, columns=["connection_id"])
    assert hidden[0]["connection_id"] not in set(frames["connection_id"].to_pylist())
    summary = ackscope("summary", "--lake", str(lake_dir))
    assert "TLS connections not decrypted: 1 (1: no key for that client random)" in summary.stdout
    assert "[TLSv1.3: not decrypted: no key for that client random]" in summary.stdout


def test_no_secret_of_the_key_log_reaches_the_lake_the_report_or_the_errors(recording, tmp_path):
    out, keylog, _, _ = recording
    marked = tmp_path / "marked.log"
    marked.write_text(keylog.read_text() + f"CLIENT_RANDOM {'00' * 32} {MARKER}\n"
                      f"CLIENT_RANDOM not-hex {MARKER}\nCLIENT_TRAFFIC_SECRET_0 {MARKER}\n")
    lake_dir = tmp_path / "lake"
    for extra in ([], ["--json"]):
        result = ackscope("ingest", str(out / "tls.pcapng"), "--lake", str(lake_dir), "--tls-keylog", str(marked), *extra)
        assert result.returncode == 0, result.stderr
        assert MARKER not in result.stdout + result.stderr
    assert "2 line(s) not in the key log format skipped" in ackscope(
        "ingest", str(out / "tls.pcapng"), "--lake", str(tmp_path / "lake2"), "--tls-keylog", str(marked)).stdout
    secrets = [MARKER.encode(), bytes.fromhex(MARKER)]
    for entry in read_keylog(str(keylog))._secrets.values():
        for secret in entry.values():
            secrets += [secret, secret.hex().encode()]
    for folder, _, files in os.walk(lake_dir):
        for file in files:
            data = (Path(folder) / file).read_bytes()
            assert not any(secret in data for secret in secrets), file
    missing = ackscope("ingest", str(out / "tls.pcapng"), "--lake", str(lake_dir), "--tls-keylog", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "cannot read the TLS key log" in missing.stderr


def test_a_lost_packet_inside_tls_is_a_gap_and_nothing_false(recording, ingested, tmp_path):
    """A packet of the broker's records lost from the capture: the gap is marked; every frame decoded
    is one the whole capture has too (per connection and method, never more)."""
    out, keylog, _, names = recording
    whole_report, whole_lake = ingested
    capture = str(out / "tls.pcapng")
    rows = connections_by_name(whole_lake, names)
    port = rows["clean13"]["client_port"]
    packets = subprocess.run(["tshark", "-r", capture, "-Y", f"tcp.dstport == {port} && tcp.len > 100",
                              "-T", "fields", "-e", "frame.number"], capture_output=True, text=True,
                             check=True).stdout.split()
    assert len(packets) >= 3
    damaged = tmp_path / "lost.pcapng"
    subprocess.run(["editcap", capture, str(damaged), packets[len(packets) // 2]], check=True, capture_output=True)
    result = ackscope("ingest", str(damaged), "--lake", str(tmp_path / "lake"), "--tls-keylog", str(keylog), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["gaps"] >= 1 and not report["errors"]
    def counts(lake_dir):
        frames = lake.read_table(str(lake_dir), "frames", schema.FRAMES, columns=["connection_id", "method"])
        return Counter(zip(frames["connection_id"].to_pylist(), frames["method"].to_pylist()))
    whole, cut = counts(whole_lake), counts(tmp_path / "lake")
    conn = rows["clean13"]["connection_id"]
    assert cut[(conn, "capture.gap")] >= 1
    for key, n in cut.items():
        if not key[1].startswith("capture."):  # the gap, and the framer finding its footing after it
            assert n <= whole[key], key
    assert cut[(conn, "connection.close-ok")] == 1  # decryption found its footing after the gap


def test_captures_that_end_inside_records_keep_what_came_before_and_invent_nothing(recording, ingested, tmp_path):
    out, keylog, _, _ = recording
    _, whole_lake = ingested
    capture = str(out / "tls.pcapng")
    total = int(subprocess.run(["capinfos", "-c", "-M", "-T", capture], capture_output=True, text=True,
                               check=True).stdout.splitlines()[-1].split("\t")[-1])
    half, snapped = tmp_path / "half.pcapng", tmp_path / "snapped.pcapng"
    subprocess.run(["editcap", "-r", capture, str(half), f"1-{total // 2}"], check=True, capture_output=True)
    subprocess.run(["editcap", "-s", "90", capture, str(snapped)], check=True, capture_output=True)
    result = ackscope("ingest", str(half), "--lake", str(tmp_path / "half"), "--tls-keylog", str(keylog), "--json")
    assert result.returncode == 0 and not json.loads(result.stdout)["errors"], result.stderr
    whole = lake.read_table(str(whole_lake), "frames", schema.FRAMES, columns=["connection_id", "seq", "method"])
    cut = lake.read_table(str(tmp_path / "half"), "frames", schema.FRAMES, columns=["connection_id", "seq", "method"])
    known = set(zip(*(whole[c].to_pylist() for c in ("connection_id", "seq", "method"))))
    decoded = set(zip(*(cut[c].to_pylist() for c in ("connection_id", "seq", "method"))))
    assert decoded and {row for row in decoded if row[2] not in ("capture.gap", "capture.end")} <= known
    # Every packet cut to 90 bytes: the hellos cannot be read, nothing is decrypted, nothing invented.
    result = ackscope("ingest", str(snapped), "--lake", str(tmp_path / "snapped"), "--tls-keylog", str(keylog), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert not report["errors"] and report["frames_by_method"] == {}
    assert report["tls_not_decrypted"] == {"the capture missed the handshake": report["tls_connections"]}


def test_findings_over_tls_equal_those_of_the_same_scenarios_in_plaintext(spark, tmp_path):
    """Lost confirms, unacked deliveries under an unbounded prefetch and a requeue loop, once in
    plaintext and once over each TLS version: the analysis finds the same in all three."""
    keylog = tmp_path / "keys.log"
    captures = {"plain": (None, tls_lab.PLAIN_PORT), "tls": ("tls", tls_lab.TLS_PORT)}
    for attempt in range(3):  # a capture that lost packets (a busy machine) marks gaps, and finds less: again
        run = uuid.uuid4().hex[:8]
        for capture, (tls, port) in captures.items():
            with tls_lab.recorded(tmp_path / f"{capture}.pcapng", port=port):
                for label in (("tls13", "tls12") if tls else ("plain",)):
                    context = tls_lab.client_context(label[3] + "." + label[4], keylog) if tls else None
                    tls_lab.lost_confirms(f"{label}-lost-{run}", context, f"{label}-lost-{run}")
                    tls_lab.unacked_buildup(f"{label}-unacked-{run}", context, f"{label}-unacked-{run}")
                    tls_lab.requeue_loop(f"{label}-requeue-{run}", context, f"{label}-requeue-{run}")
        reports = []
        for capture in captures:
            lake_dir = tmp_path / f"lake-{capture}"
            shutil.rmtree(lake_dir, ignore_errors=True)
            result = ackscope("ingest", str(tmp_path / f"{capture}.pcapng"), "--lake", str(lake_dir),
                              "--tls-keylog", str(keylog), "--json")
            assert result.returncode == 0, result.stderr
            reports.append(json.loads(result.stdout))
        if not any(report["gaps"] for report in reports):
            break
    else:
        gaps = [report["gaps"] for report in reports]
        pytest.fail(f"three captures in a row lost packets, so their findings cannot be compared: {gaps}")
    found = {}
    for capture in captures:
        lake_dir = str(tmp_path / f"lake-{capture}")
        analysed_as_the_command_does(spark, lake_dir)
        for finding in json.loads(ackscope("findings", "--lake", lake_dir, "--json").stdout):
            label, case, *rest = (finding["connection_name"] or "").split("-")
            if rest and rest[-1] == run:  # this run's own connections (the plaintext port is shared)
                found.setdefault(label, set()).add((case, finding["kind"], finding["channel"], finding["count"],
                                                    finding["severity"]))
    assert {("lost", "lost_confirm", 1, 30, "critical"), ("requeue", "requeue_loop", 1, 15, "warning")} <= found["plain"]
    assert found["tls13"] == found["plain"] and found["tls12"] == found["plain"], found


def test_a_lake_made_before_the_tls_columns_gains_them_at_the_next_ingest(recording, ingested, tmp_path):
    """Every connection row of the capture carries the same TLS columns as in a lake made with them.
    Not every row need have a TLS version: a flow on the port that never carried a TLS record (a
    connection attempt that carried no byte is a row of protocol "none") has none, and CI's
    recording once held such a row, counted nowhere as TLS."""
    import pyarrow as pa
    from deltalake import DeltaTable
    out, keylog, _, _ = recording
    _, new_lake = ingested
    old = pa.schema([field for field in schema.CONNECTIONS if not field.name.startswith("tls_")])
    lake.TableWriter(str(tmp_path), "connections", old).commit("made-by-an-older-ackscope")
    result = ackscope("ingest", str(out / "tls.pcapng"), "--lake", str(tmp_path), "--tls-keylog", str(keylog))
    assert result.returncode == 0, result.stderr
    columns = ["connection_id", "protocol"] + [f.name for f in schema.CONNECTIONS if f.name.startswith("tls_")]
    gained = DeltaTable(str(tmp_path / "connections")).to_pyarrow_table(columns=columns)  # as any Delta reader sees it
    made_with_them = DeltaTable(str(new_lake / "connections")).to_pyarrow_table(columns=columns)
    assert sorted(gained.to_pylist(), key=str) == sorted(made_with_them.to_pylist(), key=str)
    assert {"TLSv1.2", "TLSv1.3"} <= set(gained["tls_version"].to_pylist())


def test_a_capture_that_joins_tls_connections_after_their_handshake_records_them_as_tls_not_decrypted(
        recording, tmp_path):
    out, keylog, _, _ = recording
    capture = str(out / "tls.pcapng")
    # Cut at the middle application-data record of the first connection that has at least ten: a
    # point where that connection is surely past its handshake, with decrypted ones still to come.
    # (A fixed cut, say at half the packets, lands wherever the recording's timing puts it, at times
    # between two connections.)
    records = [line.split("\t") for line in subprocess.run(
        ["tshark", "-r", capture, "-Y", "tls.app_data", "-T", "fields", "-e", "frame.number", "-e", "tcp.stream",
         "-e", "tcp.srcport", "-e", "tcp.dstport"], capture_output=True, text=True, check=True).stdout.splitlines()]
    per_stream = Counter(stream for _, stream, _, _ in records)
    chosen = next(stream for _, stream, _, _ in records if per_stream[stream] >= 10)
    in_chosen = [(int(number), int(sport), int(dport)) for number, stream, sport, dport in records
                 if stream == chosen]
    cut_at, sport, dport = in_chosen[len(in_chosen) // 2]
    client_port = dport if sport == 5671 else sport
    late = tmp_path / "late.pcapng"
    subprocess.run(["editcap", "-r", capture, str(late), f"{cut_at}-{2 ** 31 - 1}"], check=True, capture_output=True)
    result = ackscope("ingest", str(late), "--lake", str(tmp_path / "lake"), "--tls-keylog", str(keylog), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tls_not_decrypted"].get("the capture missed the handshake", 0) >= 1
    assert report["unsupported_flows"] == 0  # TLS, not bytes of an unknown protocol
    rows = lake.read_table(str(tmp_path / "lake"), "connections", schema.CONNECTIONS).to_pylist()
    [joined] = [row for row in rows if row["client_port"] == client_port and row["server_port"] == 5671]
    assert (joined["protocol"], joined["tls_decrypted"], joined["tls_note"]) == (
        "tls", False, "the capture missed the handshake")
    decrypted = {row["connection_id"] for row in rows if row["tls_decrypted"]}
    frames = lake.read_table(str(tmp_path / "lake"), "frames", schema.FRAMES, columns=["connection_id"])
    assert decrypted and set(frames["connection_id"].to_pylist()) <= decrypted


def test_amqps_cut_into_pieces_and_ingested_one_file_at_a_time_gives_the_whole_captures_tables(
        recording, ingested, tmp_path):
    """Issues 59 and 61 on one flow: a TLS connection's state (records, sequence numbers, the
    layer's facts; never a key) is saved at the end of each ingest and continued by the next, its
    keys derived again from the key log; so are files given to one command."""
    from tests.pieces_support import cut, packet_count, tables

    out, keylog, _, _ = recording
    whole = str(out / "tls.pcapng")
    n = packet_count(whole)
    before = sorted({n // 7, n // 3, n // 2 + 1, (4 * n) // 5})
    pieces, offsets = cut(whole, before, str(tmp_path / "ring"))
    expected = tables(str(ingested[1]))
    continued = 0
    for piece in pieces:
        result = ackscope("ingest", piece, "--lake", str(tmp_path / "scheduled"), "--tls-keylog", str(keylog),
                          "--source", "tls-ring", "--continue-within", "3600")
        assert result.returncode == 0, result.stderr
        continued += "continues the" in result.stdout
    assert continued >= 1  # a cut fell inside a connection: its saved state carried it on
    assert tables(str(tmp_path / "scheduled"), offsets) == expected
    result = ackscope("ingest", *pieces, "--lake", str(tmp_path / "one"), "--tls-keylog", str(keylog))
    assert result.returncode == 0, result.stderr
    assert tables(str(tmp_path / "one"), offsets) == expected
    saved = "".join(p.read_text(errors="replace") for p in (tmp_path / "scheduled").rglob("*") if p.is_file())
    secrets = [line.split()[2] for line in keylog.read_text().splitlines()
               if not line.startswith("#") and len(line.split()) == 3]
    assert secrets and not [secret for secret in secrets if secret in saved]  # no key log secret in the lake
