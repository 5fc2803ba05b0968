"""How the tests know dumpcap has started (tests/lab/recording.py, `said_file`), with a shell
standing in for dumpcap: what it writes to stderr and when is then exact, not up to the machine."""

from __future__ import annotations

import subprocess

import pytest

from tests.lab.errors import LabError
from tests.lab.recording import said_file


def writer(script: str) -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def test_the_file_line_is_seen_when_it_arrives_with_the_line_before_it():
    # One write puts both lines in the pipe at once, as a busy machine does with dumpcap's two. A
    # buffered readline took both and select() then waited on an empty pipe until the timeout.
    process = writer("printf \"Capturing on 'Loopback: lo'\\nFile: /tmp/x.pcapng\\n\" >&2; exec sleep 30")
    try:
        said_file(process, timeout=10)
        assert process.poll() is None  # returned on the line, not on the writer's end
    finally:
        process.kill()
        process.wait()


def test_the_file_line_is_seen_when_it_comes_in_pieces():
    process = writer("printf 'Capturing on lo\\nFi' >&2; sleep 0.3; printf 'le: /tmp/x.pcapng\\n' >&2; exec sleep 30")
    try:
        said_file(process, timeout=10)
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


def test_a_writer_that_exits_without_the_file_line_is_an_error_naming_what_it_said():
    process = writer("printf 'dumpcap: The capture session could not be initiated\\n' >&2; exit 2")
    with pytest.raises(LabError, match=r"exited \(2\): dumpcap: The capture session could not be initiated"):
        said_file(process, timeout=10)


def test_a_writer_that_never_says_file_is_killed_at_the_timeout():
    process = writer("printf 'Capturing on lo\\n' >&2; exec sleep 30")
    with pytest.raises(LabError, match="did not start capturing within 1s: Capturing on lo"):
        said_file(process, timeout=1)
    assert process.wait(timeout=10) != 0  # killed, not left running
