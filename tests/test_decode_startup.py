"""`ackscope ingest` as a process of its own starts without pandas and ends without tearing the
interpreter down (analyzer/pandas_probe.py, cli.main): the same tables, report and exit codes as an
ingest run inside another process, which does neither."""

import json
import os
import subprocess
import sys

import pytest

from analyzer import cli, lake, schema
from analyzer.fingerprint import Fingerprints, fingerprint

from .test_capture_files import traffic
from .wire import write_pcap

SAMPLE = os.path.join(os.path.dirname(cli.__file__), "samples", "lost_confirms.pcapng")


def _frames(lake_dir) -> list[dict]:
    table = lake.read_table(str(lake_dir), "frames", schema.FRAMES)
    return table.sort_by([("connection_id", "ascending"), ("seq", "ascending")]).to_pylist()


def test_the_ingest_command_imports_no_pandas_and_writes_what_an_in_process_run_writes(tmp_path, capsys):
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "analyzer.cli", "ingest", SAMPLE,
                             "--lake", str(tmp_path / "command"), "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert "pyarrow" in imported and not [name for name in imported if name.startswith("pandas.")]
    assert cli.main(["ingest", SAMPLE, "--lake", str(tmp_path / "in-process"), "--json"]) == cli.EXIT_OK
    in_process = json.loads(capsys.readouterr().out)
    command = json.loads(result.stdout)
    for report in (in_process, command):
        for file_report in report["files"]:
            file_report.pop("seconds")
    assert command == in_process and command["rows"] > 0
    assert _frames(tmp_path / "command") == _frames(tmp_path / "in-process")


def test_the_ingest_command_keeps_its_exit_codes(tmp_path):
    damaged = str(tmp_path / "cut.pcap")
    write_pcap(damaged, traffic())
    with open(damaged, "r+b") as f:
        f.truncate(os.path.getsize(damaged) - 7)
    command = [sys.executable, "-m", "analyzer.cli", "ingest", "--lake", str(tmp_path / "lake")]
    cut = subprocess.run(command + [damaged], capture_output=True, text=True)
    assert cut.returncode == cli.EXIT_DAMAGED and "truncated" in cut.stderr
    missing = subprocess.run(command + [str(tmp_path / "missing.pcap")], capture_output=True, text=True)
    assert missing.returncode == cli.EXIT_UNREADABLE and "cannot read" in missing.stderr


def test_fingerprints_computed_ahead_are_the_files_own(tmp_path):
    other = tmp_path / "other.bin"
    other.write_bytes(b"not a capture")
    missing = str(tmp_path / "missing.pcap")
    ahead = Fingerprints([SAMPLE, str(other), missing, SAMPLE])
    assert ahead(SAMPLE) == fingerprint(SAMPLE) and ahead(str(other)) == fingerprint(str(other))
    with pytest.raises(FileNotFoundError):  # as fingerprint() raises it: ingest reports the file unreadable
        ahead(missing)
    assert ahead(str(other)) == Fingerprints([])(str(other))  # a file not listed is hashed on the spot
