"""The recorded lab examples under examples/: decoding them needs no broker and no timing luck."""

import glob
import json
import os

import pytest

from analyzer.ingest import decode

from .conftest import ROOT
from .tshark import frames_by_method as tshark_frames_by_method

EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))


def test_the_examples_are_there():
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("capture", EXAMPLES, ids=os.path.basename)
def test_example_decodes_like_tshark(capture):
    report, connections = decode(capture, lambda table: None)
    assert report.errors == [] and report.gaps == 0
    assert report.frames_by_method == tshark_frames_by_method(capture)
    with open(capture.replace(".pcapng", ".expected.json")) as f:
        expected = json.load(f)
    named = {c["connection_name"] for c in connections if c["connection_name"]}
    pinned = {e["connection_name"] for e in expected["expect"] if e.get("connection_name")}
    if expected["scenario"] != "mid_stream":  # its connections opened before the recording: no names on the wire
        assert pinned <= named
