"""`ackscope push` against a real Pushgateway: what it pushes from hand-built Delta tables, that a
push replaces the group (gone findings disappear), a lake without findings, a failed analysis, the
application cap, and an unreachable gateway."""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from analyzer import cli, metric_names, push, schema
from analyzer.lake import TableWriter

from .prometheus_stack import free_port, pushgateway, pushgateway_series

T0 = 1_700_000_000 * 10**9


def write(lake_dir: str, name: str, table_schema: pa.Schema, rows: list[dict]) -> None:
    writer = TableWriter(lake_dir, name, table_schema)
    writer.write(pa.Table.from_pylist([{"date": "2023-11-14", **row} for row in rows], schema=table_schema))
    writer.commit(f"test-{name}-{len(rows)}")


def connection(cid: str, name: str | None, vhost: str = "/", product: str = "pika") -> dict:
    return {"connection_id": cid, "connection_name": name, "vhost": vhost, "client_product": product,
            "client_addr": "10.0.0.7"}


def finding(kind: str, severity: str, cid: str, count: int, name: str | None = None) -> dict:
    return {"finding_id": f"{kind}-{cid}", "kind": kind, "severity": severity, "connection_id": cid,
            "connection_name": name, "count": count, "first_ts_ns": T0, "last_ts_ns": T0}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with pushgateway(str(tmp_path_factory.mktemp("pushgateway"))) as url:
        yield url


@pytest.fixture
def lake_dir(tmp_path):
    return analysed_lake(str(tmp_path / "lake"))


def analysed_lake(lake_dir: str) -> str:
    """Hand-built analysis tables (also written to object storage by tests/test_object_storage.py)."""
    write(lake_dir, "connections", schema.CONNECTIONS, [
        connection("c1", "orders-api"), connection("c2", "billing", vhost="prod"),
        connection("c3", None, product="pika")])
    write(lake_dir, "findings", schema.FINDINGS, [
        finding("lost_confirm", "critical", "c1", 30), finding("lost_confirm", "critical", "c1", 10),
        finding("requeue_loop", "warning", "c2", 12), finding("out_of_order_confirm", "info", "c3", 4)])
    write(lake_dir, "channel_metrics", schema.CHANNEL_METRICS, [
        # c1 channel 1: the last bucket says 0 unacked (an earlier one said 5: not the end state).
        {"connection_id": "c1", "channel": 1, "incarnation": 1, "bucket_start_ns": T0, "unacked": 5,
         "oldest_unacked_age_ns": 9 * 10**9},
        {"connection_id": "c1", "channel": 1, "incarnation": 1, "bucket_start_ns": T0 + 10**10, "unacked": 0},
        # c2: two incarnations still holding deliveries at the end: summed, the oldest age the max.
        {"connection_id": "c2", "channel": 1, "incarnation": 1, "bucket_start_ns": T0, "unacked": 3,
         "oldest_unacked_age_ns": 2 * 10**9, "unconfirmed": 2, "oldest_unconfirmed_age_ns": 5 * 10**8},
        {"connection_id": "c2", "channel": 2, "incarnation": 1, "bucket_start_ns": T0, "unacked": 4,
         "oldest_unacked_age_ns": 7 * 10**9}])
    write(lake_dir, "publishes", schema.PUBLISHES, [
        {"connection_id": "c1", "outcome": "acked", "settle_latency_ns": 2 * 10**6},
        {"connection_id": "c1", "outcome": "nacked", "settle_latency_ns": 400 * 10**6},
        {"connection_id": "c1", "outcome": "lost", "settle_latency_ns": 50 * 10**9}])  # a close is no confirm
    write(lake_dir, "deliveries", schema.DELIVERIES, [
        {"connection_id": "c2", "outcome": "ack", "no_ack": False, "settle_latency_ns": 3 * 10**9},
        {"connection_id": "c2", "outcome": "reject", "no_ack": False, "settle_latency_ns": 10**9},  # on a bound
        {"connection_id": "c2", "outcome": "auto", "no_ack": True, "settle_latency_ns": 0}])
    started = datetime(2023, 11, 14, 22, 0, tzinfo=timezone.utc)
    write(lake_dir, "analysis_runs", schema.ANALYSIS_RUNS, [
        {"run_id": "r1", "started_ts": started, "finished_ts": started.replace(minute=1, second=30), "frames": 1234}])
    return lake_dir


def samples(url: str, name: str, job: str = "t1") -> dict:
    """{(label values besides the grouping key): value} of one metric of one job's group."""
    out = {}
    for series in pushgateway_series(url):
        if series["name"] == name and series["labels"]["job"] == job:
            key = tuple(sorted((k, v) for k, v in series["labels"].items() if k not in ("job", "lake", "instance")))
            out[key] = series.get("value", series)
    return out


def where(kind=None, severity=None, vhost="/", application="orders-api") -> tuple:
    pairs = {"vhost": vhost, "application": application}
    if kind:
        pairs.update(kind=kind, severity=severity)
    return tuple(sorted(pairs.items()))


def test_push_puts_every_analysis_metric_and_a_second_push_replaces_the_group(gateway, lake_dir):
    assert cli.main(["push", "--lake", lake_dir, "--pushgateway", gateway, "--job", "t1"]) == 0

    held = {s["name"] for s in pushgateway_series(gateway) if s["labels"].get("job") == "t1"}
    assert {m.name for m in metric_names.METRICS if m.source == metric_names.ANALYSIS} <= held
    assert samples(gateway, "ackscope_findings") == {
        where("lost_confirm", "critical"): 2.0,
        where("requeue_loop", "warning", "prod", "billing"): 1.0,
        where("out_of_order_confirm", "info", application="pika@10.0.0.7"): 1.0}
    assert samples(gateway, "ackscope_finding_items")[where("lost_confirm", "critical")] == 40.0
    assert samples(gateway, "ackscope_analysis_unacked_deliveries") == {where(): 0.0,
                                                                       where(vhost="prod", application="billing"): 7.0}
    assert samples(gateway, "ackscope_analysis_oldest_unacked_seconds")[where("", None, "prod", "billing")] == 7.0
    assert samples(gateway, "ackscope_analysis_unconfirmed_publishes")[where("", None, "prod", "billing")] == 2.0
    assert samples(gateway, "ackscope_analysis_oldest_unconfirmed_seconds")[where("", None, "prod", "billing")] == 0.5
    confirm = samples(gateway, "ackscope_analysis_publish_confirm_seconds")[where()]
    assert confirm["count"] == 2 and confirm["sum"] == pytest.approx(0.402)
    assert float(confirm["buckets"]["0.0025"]) == 1 and float(confirm["buckets"]["0.5"]) == 2
    acks = samples(gateway, "ackscope_analysis_deliver_ack_seconds")[where(vhost="prod", application="billing")]
    assert acks["count"] == 2 and acks["sum"] == 4.0
    assert [float(acks["buckets"][le]) for le in ("0.5", "1", "2.5", "5", "+Inf")] == [0, 1, 1, 2, 2]
    assert samples(gateway, "ackscope_analysis_last_success_timestamp_seconds") == {(): 1699999290.0}
    assert samples(gateway, "ackscope_analysis_duration_seconds") == {(): 90.0}
    assert samples(gateway, "ackscope_analysis_frames") == {(): 1234.0}
    assert samples(gateway, "ackscope_analysis_failures") == {(): 0.0}

    # The analysis changes: the lost confirms are gone, a new finding came. The group is replaced.
    shutil.rmtree(os.path.join(lake_dir, "findings"))
    write(lake_dir, "findings", schema.FINDINGS, [finding("confirm_nack", "warning", "c1", 3)])
    assert cli.main(["push", "--lake", lake_dir, "--pushgateway", gateway, "--job", "t1"]) == 0
    assert samples(gateway, "ackscope_findings") == {where("confirm_nack", "warning"): 1.0}
    assert samples(gateway, "ackscope_finding_items") == {where("confirm_nack", "warning"): 3.0}


def test_a_failed_analysis_adds_the_failure_and_keeps_the_last_good_findings(gateway, lake_dir):
    push.push(lake_dir, gateway, job="t2")
    push.push_failure(lake_dir, gateway, job="t2")
    group = [s for s in pushgateway_series(gateway) if s["labels"].get("job") == "t2"]
    assert [s["value"] for s in group if s["name"] == "ackscope_analysis_failures"] == [1.0]
    assert sum(s["value"] for s in group if s["name"] == "ackscope_findings") == 4
    push.push(lake_dir, gateway, job="t2")  # the next good run clears it
    group = [s for s in pushgateway_series(gateway) if s["labels"].get("job") == "t2"]
    assert [s["value"] for s in group if s["name"] == "ackscope_analysis_failures"] == [0.0]


def test_a_lake_without_findings_pushes_no_findings_and_no_failure(gateway, tmp_path):
    lake_dir = str(tmp_path / "ingested-only")
    write(lake_dir, "connections", schema.CONNECTIONS, [connection("c1", "orders-api")])
    assert cli.main(["push", "--lake", lake_dir, "--pushgateway", gateway, "--job", "t3"]) == 0
    group = [s for s in pushgateway_series(gateway) if s["labels"].get("job") == "t3"]
    assert not [s for s in group if s["name"] in ("ackscope_findings", "ackscope_analysis_last_success_timestamp_seconds")]
    assert [s["value"] for s in group if s["name"] == "ackscope_analysis_failures"] == [0.0]


def test_the_cap_folds_applications_beyond_it_into_other(gateway, lake_dir):
    pushed = push.push(lake_dir, gateway, job="t4", max_applications=2)
    apps = {s.labels["application"] for f in pushed.families if f.name == "ackscope_findings" for s in f.samples}
    assert apps == {"billing", "orders-api", "other"}  # sorted: "pika@10.0.0.7" comes third
    assert pushed.folded["ackscope_findings"] == 1


def test_refused_connections_take_no_slot_vhosts_are_capped_and_values_cut(tmp_path):
    """A connection with neither a channel nor a finding (the broker refused it) sorts first and
    still takes no slot; vhosts have a cap of their own; a long name is cut with a marker."""
    lake = str(tmp_path / "lake")
    long_name = "z" * 500
    write(lake, "connections", schema.CONNECTIONS, [
        connection("c0", "aaa-refused", vhost="aaa-refused-vhost"), connection("c1", "orders-api"),
        connection("c2", "billing", vhost="prod"), connection("c3", long_name)])
    write(lake, "findings", schema.FINDINGS, [finding("lost_confirm", "critical", c, 1) for c in ("c1", "c2", "c3")])
    pushed = push.analysis_families(lake, max_applications=3, max_vhosts=1)
    series = {(s.labels["vhost"], s.labels["application"]) for f in pushed.families if f.name == "ackscope_findings"
              for s in f.samples}
    assert series == {("/", "orders-api"), ("other", "billing"), ("/", "z" * 120 + "...[+380 chars]")}
    assert pushed.folded == {"ackscope_findings": 1}


def test_an_unreachable_gateway_is_a_clear_error_and_exit_status(lake_dir, capsys):
    closed = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["push", "--lake", lake_dir, "--pushgateway", closed]) == cli.EXIT_PUSH_FAILED
    err = capsys.readouterr().err
    assert f"could not push to the Pushgateway at {closed}" in err and "refused" in err.lower()


def test_a_failing_analyze_run_pushes_the_failure(gateway, lake_dir):
    """The real command, in its own process (its Spark session is its own): the analysis fails (the
    frames folder holds no Delta table), it says so with exit status 5, and the group shows it."""
    import subprocess
    import sys

    push.push(lake_dir, gateway, job="t5")
    os.makedirs(os.path.join(lake_dir, "frames"))
    run = subprocess.run([sys.executable, "-m", "analyzer.cli", "analyze", "--lake", lake_dir, "--master", "local[1]",
                          "--pushgateway", gateway, "--push-job", "t5"], capture_output=True, text=True, timeout=300)
    assert run.returncode == cli.EXIT_ANALYSIS_FAILED, run.stderr[-2000:]
    assert f"the analysis of {lake_dir} failed" in run.stderr
    assert samples(gateway, "ackscope_analysis_failures", job="t5") == {(): 1.0}
    assert sum(samples(gateway, "ackscope_findings", job="t5").values()) == 4


def test_analyze_pushes_through_the_same_push(gateway, lake_dir, capsys):
    """What `analyze --pushgateway` runs after a good run, and after a failed one; an unreachable
    gateway turns into a message and False (the command then exits 6)."""
    from argparse import Namespace

    assert cli._push_after_analysis(Namespace(lake=lake_dir, pushgateway=gateway, push_job="t6"), failed=True)
    assert samples(gateway, "ackscope_analysis_failures", job="t6") == {(): 1.0}
    assert cli._push_after_analysis(Namespace(lake=lake_dir, pushgateway=gateway, push_job="t6"), failed=False)
    assert samples(gateway, "ackscope_analysis_failures", job="t6") == {(): 0.0}
    assert sum(samples(gateway, "ackscope_findings", job="t6").values()) == 4
    closed = f"http://127.0.0.1:{free_port()}"
    assert not cli._push_after_analysis(Namespace(lake=lake_dir, pushgateway=closed, push_job="t6"), failed=False)
    assert f"ackscope analyze: could not push to the Pushgateway at {closed}" in capsys.readouterr().err
