"""ACKSCOPE_PURE_PYTHON=1 runs the pure-Python reference, not the C twins (analyzer/_lane.c,
_columns.c, _folds.c, timeline/_plain.c and _records.c, detectors/_profile.c).

CI runs the rule, timeline, detector and pass tests a second time under the variable (the Makefile's
`test` target); that second run proves the reference whole only if nothing of C runs in it. Here a
real decode and analysis of the bundled sample, in a new interpreter, is watched by a profiler that
sees every call into a C function: under the variable none is one of the twins', without it the
twins do the work (so the watch does see them).
"""

import json
import os
import subprocess
import sys

from analyzer import pure_python

TWINS = ("analyzer._lane", "analyzer._columns", "analyzer._folds", "analyzer.timeline._plain",
         "analyzer.timeline._records", "analyzer.detectors._profile")

# Decode the sample into a lake (the lane), read its frames back through the pass's Arrow rows
# (_columns), and run every connection through the timelines, channel_metrics and the detectors
# (_plain, _records, _folds, _profile), while the profiler counts calls into each twin.
_WATCHED_RUN = f"""
import collections, json, sys, tempfile, threading
TWINS = {TWINS!r}
calls = collections.Counter()

def watch(frame, event, arg):
    if event == "c_call":
        owner = getattr(arg, "__self__", None)
        module = getattr(arg, "__module__", None) or (owner.__name__ if isinstance(owner, type(sys)) else
                                                      type(owner).__module__)
        if module in TWINS:
            calls[module] += 1

sys.setprofile(watch)
threading.setprofile(watch)
from analyzer import columns, lake, schema
from analyzer.cli import sample_captures
from analyzer.detectors import ConnectionDetectors, wants_frame
from analyzer.detectors.thresholds import Thresholds
from analyzer.ingest import ingest_file
from analyzer.timeline import INPUT_COLUMNS, Timelines
from analyzer.timeline.metrics import ChannelMetrics

with tempfile.TemporaryDirectory() as folder:
    for capture in sample_captures():
        ingest_file(capture, folder)
    frames = lake.read_table(folder, "frames", schema.FRAMES).sort_by([("connection_id", "ascending"),
                                                                       ("seq", "ascending")])
    connections = lake.read_table(folder, "connections", schema.CONNECTIONS).to_pylist()
rows = [row for batch in frames.to_batches() for row in columns.batch_rows(batch)]
findings = 0
for connection in connections:
    detectors = ConnectionDetectors(connection, Thresholds())
    timelines, metrics = Timelines(), ChannelMetrics()
    for row in rows:
        if row["connection_id"] != connection["connection_id"]:
            continue
        if wants_frame(row):
            detectors.frame(row)
        for record in timelines.feed({{name: row[name] for name in INPUT_COLUMNS}}):
            detectors.record(record)
            metrics.record(record)
    for record in timelines.end_of_data():
        detectors.record(record)
        metrics.record(record)
    findings += len(detectors.findings(lambda seqs: [None for _ in seqs]))
sys.setprofile(None)
print(json.dumps({{"calls": dict(calls), "rows": len(rows), "findings": findings}}))
"""


def _watched_run(pure: str) -> dict:
    env = {**os.environ, "ACKSCOPE_PURE_PYTHON": pure}
    done = subprocess.run([sys.executable, "-c", _WATCHED_RUN], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_under_the_variable_no_c_twin_runs():
    pure, compiled = _watched_run("1"), _watched_run("0")
    assert pure["rows"] == compiled["rows"] > 50 and pure["findings"] == compiled["findings"] > 0
    assert pure["calls"] == {}
    # Without the variable the same run goes through the twins: the watch sees them.
    assert set(compiled["calls"]) >= {"analyzer._lane", "analyzer.timeline._plain", "analyzer.timeline._records",
                                      "analyzer._folds"}, compiled


def test_this_process_runs_what_the_variable_asks():
    """In the suite's own process (both CI runs): every switch agrees with the variable."""
    from analyzer import columns, folds, native
    from analyzer.detectors import profile
    from analyzer.timeline import plain, records

    pure = os.environ.get("ACKSCOPE_PURE_PYTHON", "") not in ("", "0")
    assert pure_python() == pure
    assert native.enabled() == columns.enabled() == (not pure)
    assert (profile._fold_in_c is None) == pure
    assert (records.Delivery.new is records.Delivery) == pure
    assert (plain._plain is None or plain.pure_python()) == pure
    assert (folds._folds is None or folds.pure_python()) == pure
