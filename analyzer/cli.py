"""The `ackscope` command line."""

import argparse
import json
import os
import sys
from collections import Counter
from datetime import date
from importlib import resources

from .fingerprint import Fingerprints
from .pandas_probe import answer_pandas_probe_without_pandas
from .spec import DEFAULT_BROKER_PORTS, DEFAULT_CONTINUE_WITHIN_S, DEFAULT_MAX_FRAME
from .terminal import LINE_LIMIT, PrintableFormatter, printable
from .worker_pool import worker_pool

EXIT_OK = 0
EXIT_DAMAGED = 3      # a capture was truncated or corrupt: everything read before the damage was committed
EXIT_UNREADABLE = 4   # a file was not a readable capture: nothing was ingested from it
EXIT_ANALYSIS_FAILED = 5
EXIT_PUSH_FAILED = 6  # the Pushgateway could not be reached or refused the push
EXIT_AGENT_FAILED = 7  # the live agent met an internal error: it flushed what was consistent, restart it
EXIT_LAKE_DAMAGED = 8  # a data file of a table could not be read (damaged, cut short, missing): it is named

DESCRIPTION = """\
ackscope: AMQP 0-9-1 (RabbitMQ) traffic analyser. It decodes captures into Delta Lake tables and
finds lost publisher confirms, unacked-message buildup, requeue loops and out-of-order confirms."""


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["capture"]:
        choose_agent_allocators()  # first, before anything loads pyarrow or delta-rs
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is not None or args.run is not run_ingest:
        return run_command(args)
    # `ackscope ingest` as a process of its own (not demo, whose Spark half hands pandas objects to
    # pyarrow, nor a caller in the same process): it can start without pandas, and end without tearing
    # the interpreter down (modules, Arrow's memory pools, delta-rs's runtime: ~0.1 s) once everything
    # is committed, closed and printed.
    status = run_ingest(args, own_process=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_command(args) -> int:
    """The command, with what befalls any of them said plainly: a data file of the lake that cannot
    be read, named (a reader meets it; `analyze` itself sets an analysis table aside and rebuilds
    it, see docs/analysis.md), and a reader that went away (`ackscope findings | head`)."""
    from .lake import UnreadableFile
    try:
        return args.run(args)
    except UnreadableFile as exc:
        print(f"ackscope: a table of the lake cannot be read: {printable(exc, LINE_LIMIT)}. An analysis table "
              f"(findings, deliveries, ...) is set aside and made again by the next `ackscope analyze`; frames "
              f"or connections must be restored from a copy or ingested again", file=sys.stderr)
        return EXIT_LAKE_DAMAGED
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # as a shell reports a command ended by SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ackscope", description=DESCRIPTION)
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    ingest = commands.add_parser(
        "ingest", help="decode pcap/pcapng files into the frames and connections Delta tables",
        description="Decode AMQP 0-9-1 traffic from pcap/pcapng files into the Delta tables LAKE/frames "
                    "(one row per method frame, plus heartbeats, capture gaps and TCP ends) and "
                    "LAKE/connections (one row per TCP flow on a broker port). The files are one capture "
                    "in pieces (a ring buffer's, rotated files): read in the order of their first "
                    "packets, a connection going on across them; connections still open at the end are "
                    "saved in LAKE/flow_state and continued by the next ingest of the same --source. "
                    "They land in one atomic commit per table; a file already ingested is skipped. "
                    "Message bodies and SASL credentials are never stored.",
        epilog=f"Exit status: {EXIT_OK} all files decoded; {EXIT_DAMAGED} a file was truncated or corrupt "
               f"(every packet before the damage was committed); {EXIT_UNREADABLE} a file was not a "
               "readable capture (nothing ingested from it); 2 bad arguments.")
    ingest.add_argument("files", nargs="*", metavar="FILE", help="pcap or pcapng capture files, one capture "
                        "in pieces (read in the order of their first packets)")
    ingest.add_argument("--lake", required=True, metavar="DIR", help="folder holding the Delta tables")
    ingest.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    ingest.add_argument("--agent-id", default="", metavar="ID",
                        help="who captured the traffic (host or pod name); stored with every row")
    ingest.add_argument("--ports", default=",".join(str(p) for p in sorted(DEFAULT_BROKER_PORTS)),
                        metavar="P,P", help="broker ports: flows on them are decoded, or reported "
                        "unsupported if they speak another protocol (default %(default)s); AMQP 0-9-1 "
                        "on any other port is found by its protocol header")
    ingest.add_argument("--tls-keylog", action="append", default=[], metavar="KEYLOG",
                        help="TLS key log in the NSS format (SSLKEYLOGFILE, keylog_filename) that amqps "
                        "connections are decrypted with; repeat for several. As sensitive as the traffic: "
                        "its secrets are never stored or shown. Without a key a TLS connection is recorded "
                        "as not decrypted, with no frames")
    ingest.add_argument("--max-frame-size", type=int, default=DEFAULT_MAX_FRAME, metavar="BYTES",
                        help="largest frame accepted before frame_max is negotiated (default %(default)s)")
    ingest.add_argument("--workers", type=int, default=1, metavar="N",
                        help="decode with N processes, flows split between them (default %(default)s)")
    ingest.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress line on stderr (default: when stderr is a terminal)")
    ingest.add_argument("--source", default=None, metavar="NAME",
                        help="the capture source the files come from: a later ingest of the same source "
                             "continues the connections still open at the end of these files (default: "
                             "the capture interface a pcapng file names, 'interface:NAME', else the "
                             "file's folder, 'folder:PATH')")
    ingest.add_argument("--continue-within", type=float, default=DEFAULT_CONTINUE_WITHIN_S, metavar="SECONDS",
                        help="continue the source's open connections when the first packet comes at most "
                             "this long after the last one ingested, else they end there; also the "
                             "longest time gap between two files read as one capture (default %(default)s: "
                             "two RabbitMQ default heartbeat intervals)")
    ingest.add_argument("--watch", default=None, metavar="DIR",
                        help="follow a capture ring in DIR instead of reading FILEs: each file is ingested "
                             "once its writer has rotated past it (a newer file exists), in order, its "
                             "connections continued; restarted, it resumes from the lake; SIGTERM or "
                             "SIGINT stops it after the ingest under way")
    ingest.add_argument("--pattern", default=None, metavar="GLOB",
                        help="with --watch: the ring's file names (default '*.pcap*')")
    ingest.set_defaults(run=run_ingest)

    summary = commands.add_parser("summary", help="what the lake holds: connections and frames by method",
                                  description="Summarise the frames and connections tables of a lake.")
    summary.add_argument("--lake", required=True, metavar="DIR")
    summary.add_argument("--json", action="store_true", help="print one JSON object")
    summary.set_defaults(run=run_summary)

    analyze = commands.add_parser(
        "analyze", help="run the analysis (in process, or on Spark): timelines, channel metrics and findings",
        description="Read LAKE/frames and LAKE/connections, rebuild every channel's delivery-tag "
                    "timeline and write the Delta tables LAKE/deliveries, publishes, channels, violations, "
                    "channel_metrics and findings. Incremental: a run analyses only the connections with "
                    "frames added since the last run and replaces their rows (each table in one commit); "
                    "the findings those connections can change are recomputed (the connections whose provisional "
                    "rows an ingest of a capture's next piece took out: analysed whole). The first run, --full, "
                    "or other frames deleted (or compacted before a run read them) since the last run analyse "
                    "everything; "
                    "a run with nothing new reports the stored findings without starting Spark; on a local "
                    "master, a run that reads few frame rows (--local-up-to) is made by this process itself, "
                    "without Spark; the rest run on Spark. Runs are "
                    "logged in LAKE/analysis_runs; once a full or incremental run is logged, the small frames files it "
                    "analysed and the connections' small files are merged (the agents then merge none: docs/agent.md). "
                    "The same job runs on a cluster with --master, or through "
                    "spark-submit spark_jobs/job.py with these options.",
        epilog="Exit status: 0 done; 2 bad arguments, no frames table, or an S3 lake and no s3a connector in "
               f"Spark; {EXIT_ANALYSIS_FAILED} the analysis failed; {EXIT_PUSH_FAILED} its push failed. With --every: "
               f"0 stopped by a signal; 2 as above; {EXIT_ANALYSIS_FAILED} the Spark driver is gone (a failed run "
               "or push is reported and the runs go on).")
    analyze.add_argument("--lake", required=True, metavar="LAKE",
                         help="folder, or S3 URL (s3a://bucket/prefix; AWS_* variables and the hadoop-aws JARs, "
                              "docs/deployment.md), holding the Delta tables")
    analyze.add_argument("--master", help="Spark master (default local[*]; under spark-submit, the master "
                                          "spark-submit was given). On a cluster every run with new frames runs there")
    analyze.add_argument("--local-up-to", type=int, default=None, metavar="ROWS",
                         help="on a local master, a run that reads at most ROWS frame rows (the Delta log's count: "
                              "a small append's, a small lake's) is made by this process, without a JVM (default "
                              "1,000,000: spark_jobs/local_executor.py's DRIVER_FRAMES; 0: only a run with nothing "
                              "new)")
    analyze.add_argument("--driver-memory", default=None, metavar="SIZE",
                         help="Spark driver memory when this command starts the driver, e.g. 2g")
    analyze.add_argument("--since", metavar="DAY",
                         help="analyse again the connections with frames on or after this UTC day (YYYY-MM-DD); "
                              "each is analysed over all its frames")
    analyze.add_argument("--until", metavar="DAY",
                         help="with or without --since: the last UTC day whose connections are analysed again")
    analyze.add_argument("--full", action="store_true",
                         help="analyse every connection and replace the tables whole")
    analyze.add_argument("--delta-mode", choices=("auto", "native", "bridge"), default="auto",
                         help="Delta access: native delta-spark, or the delta-rs bridge (default: native "
                              "if the Delta JARs are on Spark's classpath)")
    analyze.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                         help="override a detector threshold (repeatable); see README, Findings")
    analyze.add_argument("--bucket-seconds", type=int, default=10, metavar="S",
                         help="channel_metrics time bucket (default %(default)s)")
    analyze.add_argument("--overdue-seconds", type=float, default=60.0, metavar="S",
                         help="a publish still unconfirmed this long when the data ends is overdue "
                              "(default %(default)s)")
    analyze.add_argument("--json", action="store_true", help="print one JSON object (with --every: one a run)")
    analyze.add_argument("--every", metavar="INTERVAL",
                         help="keep the driver up and start a run every INTERVAL (e.g. 5m, 90s, 1h) until SIGTERM "
                              "or Ctrl-C, which stop after the run in progress; a failed run is reported and the "
                              "next one runs at its time. A warm driver runs the analysis of a small append 1.4-2x "
                              "as fast as a fresh one (bench/README.md)")
    add_push_options(analyze, "--pushgateway", "--push-job",
                     "at the end of the run, push its results (as `ackscope push` does), or "
                     "ackscope_analysis_failures=1 if it failed")
    analyze.set_defaults(run=run_analyze)

    push = commands.add_parser(
        "push", help="push the lake's analysis to a Prometheus Pushgateway",
        description="Read the findings, channel_metrics, deliveries, publishes, connections and analysis_runs "
                    "tables (no Spark) and PUT them as metrics (docs/alerting.md) to the group {job, lake} of a "
                    "Pushgateway: the group is replaced whole, so a finding that is gone disappears.",
        epilog=f"Exit status: 0 pushed; 2 bad arguments; {EXIT_PUSH_FAILED} the Pushgateway could not be "
               "reached or refused the push.")
    push.add_argument("--lake", required=True, metavar="DIR", help="folder holding the Delta tables")
    add_push_options(push, "--pushgateway", "--job", "Pushgateway address, e.g. http://localhost:9091",
                     required=True)
    push.set_defaults(run=run_push)

    findings = commands.add_parser("findings", help="print what the analysis found",
                                   description="Print the findings table: a readable table, worst first, "
                                               "or with --json a JSON array.")
    findings.add_argument("--lake", required=True, metavar="DIR")
    findings.add_argument("--kind", help="only this kind (lost_confirm, requeue_loop, ...)")
    findings.add_argument("--json", action="store_true", help="print a JSON array")
    findings.set_defaults(run=run_findings)

    report = commands.add_parser("report", help="write the HTML report of a lake (no Spark needed)",
                                 description="Write one self-contained HTML file about LAKE: the findings worst "
                                             "first with their evidence and what to do, pictures (unacked and "
                                             "unconfirmed over time, latencies, confirm order, requeue loops) and "
                                             "the connections. It opens without network access.")
    report.add_argument("--lake", required=True, metavar="DIR")
    report.add_argument("-o", "--output", default="report.html", metavar="FILE", help="default %(default)s")
    report.set_defaults(run=run_report)

    demo = commands.add_parser("demo", help="run the whole pipeline on the bundled sample capture",
                               description="Ingest the sample capture shipped with ackscope into LAKE, "
                                           "analyse it (a lake this small in process, without starting Spark, on a "
                                           "local master), print what was found and write the HTML report "
                                           "LAKE/report.html.")
    demo.add_argument("--lake", default=".demo-lake", metavar="DIR", help="default %(default)s")
    demo.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")
    demo.set_defaults(run=run_demo)
    add_capture_command(commands)

    from dashboards.grafana.cli import add_dashboards_command
    add_dashboards_command(commands)
    return parser


def add_capture_command(commands) -> None:
    capture = commands.add_parser(
        "capture", help="the live agent: capture an interface into the lake, live gauges on /metrics",
        description="Capture AMQP 0-9-1 traffic live from a network interface (AF_PACKET, kernel BPF "
                    "filter on the broker ports; needs CAP_NET_RAW), decode it with the same core as "
                    "`ingest`, commit the frames and connections tables to LAKE every flush interval, and "
                    "serve live per-channel gauges on /metrics. Runs until SIGTERM or SIGINT, then flushes. "
                    "See docs/agent.md.",
        epilog=f"Exit status: {EXIT_OK} stopped by a signal (everything flushed); 2 bad arguments or the "
               f"interface cannot be captured; {EXIT_AGENT_FAILED} an internal error (said on /readyz and in "
               "one log line): the rows already decoded whole were flushed, the rest is left for the restarted "
               "agent, which its supervisor should start again.")
    capture.add_argument("--iface", required=True, help="interface to capture (lo, eth0, any)")
    capture.add_argument("--port", type=int, action="append", metavar="PORT",
                         help="broker port (repeat for several; default 5672, 5671, 5552, 5551)")
    capture.add_argument("--lake", required=True, metavar="DIR", help="folder holding the Delta tables")
    capture.add_argument("--metrics-addr", metavar="HOST:PORT", help="serve /metrics, /healthz and /readyz here")
    capture.add_argument("--flush-interval", type=float, default=10.0, metavar="SECONDS",
                         help="commit buffered rows this often (default %(default)s); a crash loses at most this, "
                              "the flush under way and 0.25 s")
    capture.add_argument("--agent-id", default="", metavar="ID",
                         help="this agent's name in the lake (default: the host name); one per agent")
    capture.add_argument("--pcap-out", metavar="DIR",
                         help="also write the raw packets as rotating pcapng files, readable by their owner only "
                              "(0600, the folder 0700 when created): they hold message bodies, and each "
                              "connection.start-ok's password blanked (lengths kept; the user name kept) unless "
                              "--pcap-keep-credentials")
    capture.add_argument("--pcap-keep-credentials", action="store_true",
                         help="write the SASL response (the password) in --pcap-out files as captured")
    capture.add_argument("--rotate-size", type=float, default=100.0, metavar="MB", help="pcapng file size (default %(default)s)")
    capture.add_argument("--rotate-keep", type=int, default=10, metavar="N", help="pcapng files kept (default %(default)s)")
    capture.add_argument("--compact-interval", type=float, default=3600.0, metavar="SECONDS",
                         help="compact small files, checkpoint and vacuum this often (default %(default)s)")
    capture.add_argument("--compact-min-age", type=float, default=3600.0, metavar="SECONDS",
                         help="merge only small files written at least this long ago: the scheduled analysis "
                              "merges those it has analysed, so beside it the agent merges none (docs/agent.md, "
                              "\"Memory\"; default %(default)s)")
    capture.add_argument("--retention-hours", type=float, default=1.0, metavar="H",
                         help="at each compaction, vacuum removes the files the tables stopped referencing "
                              "longer ago than this; at least 1, for readers of older versions "
                              "(default %(default)s)")
    capture.add_argument("--idle-timeout", type=float, default=600.0, metavar="SECONDS",
                         help="a connection silent this long is ended (default %(default)s)")
    capture.add_argument("--max-buffered-rows", type=int, default=1_000_000, metavar="N",
                         help="rows kept while the lake cannot be written; the oldest beyond are dropped, counted")
    capture.add_argument("--max-applications", type=int, default=200, metavar="N",
                         help="application label values before folding into \"other\" (default %(default)s)")
    capture.add_argument("--max-vhosts", type=int, default=100, metavar="N",
                         help="vhost label values before folding into \"other\" (default %(default)s); only "
                              "connections the broker accepted take a value")
    capture.add_argument("--buffer-mb", type=int, default=64, metavar="MB", help="kernel socket buffer (default %(default)s)")
    capture.add_argument("--tls-keylog", metavar="KEYLOG",
                         help="TLS key log (NSS format) the applications append to, followed as it grows: amqps "
                         "connections are decrypted with it; records wait up to 10 s for their key. Must be "
                         "readable by its owner only. See docs/tls.md")
    capture.add_argument("--json", action="store_true", help="on exit, print one JSON object instead of the summary")
    capture.set_defaults(run=run_capture)


def choose_agent_allocators() -> None:
    """The agent's allocators, set in the environment, which each library reads once, when it loads
    or first allocates: so before pyarrow and delta-rs load. (Both loaded first, with the parser,
    when run_capture set these: Arrow's C++ still mapped its 1 GiB mimalloc arena.)"""
    # delta-rs allocates with a jemalloc of its own, read from this variable when it loads, which by
    # default keeps the pages a flush frees for reuse, arena by arena (a Tokio worker each): the
    # agent's anonymous memory rose with every flush and compaction until the process ended.
    # Measured (200 flushes and 4 compactions in a loop, as in bench/soak.py): 135 -> 177 MB by
    # default, 77 -> 84 MB with freed pages handed back at once, for 0.03 s more CPU a flush. A value
    # set in the environment wins.
    os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
    # malloc rather than jemalloc or mimalloc: the agent's Arrow buffers are small and short-lived,
    # and those keep freed pages (measured: 20 MB more peak RSS at 10,000 connections,
    # bench/capture.py). set_memory_pool reaches only what pyarrow's Python calls allocate; Arrow's
    # C++ (Parquet reads and writes, compression) takes its default pool, mimalloc, unless this
    # variable says otherwise before it loads: in the soak its 1 GiB arena held 6.5 MB and grew. A
    # value set in the environment wins.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def run_capture(args) -> int:
    import logging

    choose_agent_allocators()  # too late if pyarrow or delta-rs loaded already: main() calls it first
    if "pandas" not in sys.modules:  # the agent never hands pyarrow pandas objects: ~40 MB of RSS saved
        answer_pandas_probe_without_pandas()
    import pyarrow
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())

    from .agent.capture import CaptureError
    from .agent.http import parse_address
    from .agent.run import Agent, AgentConfig, AgentFailed

    handler = logging.StreamHandler()  # its lines quote the wire (names, flows): printable, like every other line
    handler.setFormatter(PrintableFormatter("ackscope capture: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    try:
        config = AgentConfig(
            iface=args.iface, lake=args.lake, ports=tuple(args.port or sorted(DEFAULT_BROKER_PORTS)),
            agent_id=args.agent_id, metrics_addr=parse_address(args.metrics_addr) if args.metrics_addr else None,
            flush_interval_s=args.flush_interval, compact_interval_s=args.compact_interval,
            compact_min_age_s=args.compact_min_age,
            retention_hours=args.retention_hours, idle_timeout_s=args.idle_timeout,
            max_buffered_rows=args.max_buffered_rows, max_applications=args.max_applications,
            max_vhosts=args.max_vhosts,
            buffer_bytes=args.buffer_mb << 20, pcap_out=args.pcap_out,
            pcap_keep_credentials=args.pcap_keep_credentials,
            rotate_bytes=int(args.rotate_size * (1 << 20)), rotate_keep=args.rotate_keep, tls_keylog=args.tls_keylog)
        agent = Agent(config)
    except (CaptureError, ValueError, OSError) as exc:
        print(f"ackscope capture: {printable(exc, LINE_LIMIT)}", file=sys.stderr)
        return 2
    print(f"ackscope capture: capturing {printable(args.iface)} into {printable(args.lake)} as agent "
          f"{printable(agent.agent_id)}", file=sys.stderr, flush=True)
    try:
        report = agent.run()
    except AgentFailed as failed:
        if args.json:
            print(json.dumps(failed.report, sort_keys=True))
        return EXIT_AGENT_FAILED
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        frames = sum(report["frames_by_method"].values())
        print(f"ackscope capture: {report['packets']:,} packets, {report['flows']} flows, {frames:,} frames, "
              f"{report['gaps']} gaps, {report['kernel_drops']} kernel drops, flushes {report['flushes']}, "
              f"rows dropped {report['rows_dropped'] or 0}, errors {report['error_count']}", file=sys.stderr)
    return EXIT_OK  # rows dropped by a failing sink are in the report and on /metrics, not in the status


def run_ingest(args, own_process: bool = False) -> int:
    try:
        ports = frozenset(int(p) for p in args.ports.split(",") if p.strip())
    except ValueError:
        print(f"ackscope ingest: --ports takes comma-separated numbers, not {args.ports!r}", file=sys.stderr)
        return 2
    if not args.continue_within >= 0:
        print(f"ackscope ingest: --continue-within takes seconds >= 0, not {args.continue_within}", file=sys.stderr)
        return 2
    watch = getattr(args, "watch", None)
    if bool(watch) == bool(args.files) or (getattr(args, "pattern", None) and not watch):
        print("ackscope ingest: give capture FILEs, or --watch DIR (with --pattern GLOB), not both",
              file=sys.stderr)
        return 2
    try:
        keylog = read_keylogs(args.tls_keylog)
    except OSError as exc:  # the file's name and the system's reason; never its contents
        print(f"ackscope ingest: cannot read the TLS key log {printable(exc.filename)}: {exc.strerror}", file=sys.stderr)
        return 2
    if watch:
        if not os.path.isdir(watch):
            print(f"ackscope ingest: --watch {printable(watch)}: not a folder", file=sys.stderr)
            return 2
        with worker_pool(max(1, args.workers)) as pool:
            return _watch(args, ports, pool, own_process)
    fingerprints = Fingerprints(args.files)  # hashed while the workers and the imports below start
    with worker_pool(max(1, args.workers)) as pool:
        return _ingest_files(args, ports, fingerprints, pool, own_process, keylog)


def read_keylogs(paths: list[str]):
    """The key logs given, as one tls.KeyLog (None when none is given)."""
    if not paths:
        return None
    from .tls.keylog import KeyLog, read_keylog
    keylog = KeyLog()
    for path in paths:
        read_keylog(path, keylog)
    return keylog


def _ingest_options(args, ports, pool, own_process: bool) -> dict:
    if own_process:  # see main()
        answer_pandas_probe_without_pandas()
    from .lake import make_dir

    show_progress = sys.stderr.isatty() if args.progress is None else args.progress
    make_dir(args.lake)
    return dict(source=args.source, continue_within_s=args.continue_within, agent_id=args.agent_id,
                broker_ports=ports, max_frame=args.max_frame_size, show_progress=show_progress and not args.json,
                workers=max(1, args.workers), pool=pool)


def _watch(args, ports, pool, own_process: bool) -> int:
    from .ingest import ingest_files
    from .watch import DEFAULT_PATTERN, KeyLogFiles, Watcher

    options = _ingest_options(args, ports, pool, own_process)
    keylogs = KeyLogFiles(args.tls_keylog)

    def show(reports) -> None:
        _print_reports(args, reports)
        sys.stdout.flush()

    def ingest(paths):  # the key logs grow as clients connect: read again for each batch of files
        keylog, notes = keylogs.read()
        for note in notes:
            print(f"ackscope ingest: note: {note}", file=sys.stderr, flush=True)
        return ingest_files(paths, args.lake, tls_keylog=keylog, **options)

    watcher = Watcher(args.watch, args.pattern or DEFAULT_PATTERN, ingest, show)
    print(f"ackscope ingest: watching {printable(args.watch)} for {printable(args.pattern or DEFAULT_PATTERN)} "
          f"(SIGTERM or Ctrl-C stops)", file=sys.stderr)
    status = watcher.run()
    print("ackscope ingest: stopped watching", file=sys.stderr)
    return status


def _ingest_files(args, ports, fingerprints, pool, own_process: bool, keylog) -> int:
    options = _ingest_options(args, ports, pool, own_process)
    from .ingest import ingest_files

    reports = ingest_files(args.files, args.lake, fingerprint_of=fingerprints, tls_keylog=keylog, **options)
    return _print_reports(args, reports, keylog)


def _print_reports(args, reports, keylog=None) -> int:
    if args.json:
        combined = combined_json(reports)
        if keylog is not None:
            combined["tls_keylog"] = {"key_lines": keylog.lines, "corrupted_lines": keylog.corrupted}
        print(json.dumps(combined, sort_keys=True))
    else:
        for report in reports:
            print(human_report(report, args.lake))
        if keylog is not None:
            print(f"TLS key log: {keylog.lines} key line(s) for {len(keylog)} handshake(s)"
                  + (f", {keylog.corrupted} line(s) not in the key log format skipped (not shown: they may hold secrets)"
                     if keylog.corrupted else ""))
    for report in reports:
        for error in report.errors:
            print(f"ackscope: {printable(error, LINE_LIMIT)}", file=sys.stderr)
    if any(r.unreadable for r in reports):
        return EXIT_UNREADABLE
    if any(r.damaged for r in reports):
        return EXIT_DAMAGED
    return EXIT_OK


def combined_json(reports) -> dict:
    frames = Counter()
    unsupported = Counter()
    for r in reports:
        frames.update(r.frames_by_method)
        unsupported.update(r.unsupported)
    return {
        "files": [r.as_json() for r in reports],
        "packets": sum(r.packets for r in reports),
        "flows": sum(r.flows for r in reports),
        "amqp_connections": sum(r.amqp_connections for r in reports),
        "frames_by_method": dict(sorted(frames.items())),
        "gaps": sum(r.gaps for r in reports),
        "unsupported_flows": sum(unsupported.values()),
        "unsupported_protocols": dict(unsupported),
        "tls_connections": sum(r.tls_connections for r in reports),
        "tls_not_decrypted": dict(sum((r.tls_not_decrypted for r in reports), Counter())),
        "rows": sum(r.rows for r in reports),
        "errors": [e for r in reports for e in r.errors],
        "notes": [n for r in reports for n in r.notes],
    }


def human_report(report, lake_dir: str) -> str:
    """An ingested file in a few lines; its errors and notes may quote the wire, so every value is printable."""
    file, lake_text = printable(report.file), printable(lake_dir)
    notes = "".join(f"\n  note: {printable(note, LINE_LIMIT)}" for note in report.notes)
    if report.unreadable:
        return f"{file}: not ingested ({printable(report.errors[0] if report.errors else 'unreadable', LINE_LIMIT)})" + notes
    if report.skipped:
        return (f"{file}: already in {lake_text} (sha256 {report.sha256[:12]}), nothing added" + notes
                if not report.notes else f"{file}: nothing added" + notes)
    lines = [f"{file}: {report.packets:,} packets, {report.amqp_connections} AMQP 0-9-1 connection(s)"
             + (f" ({report.midstream_connections} joined mid-stream)" if report.midstream_connections else "")
             + (", unsupported flows: " + ", ".join(f"{n} {printable(p)}" for p, n in report.unsupported.most_common())
                if report.unsupported else "")]
    if report.tls_connections:
        not_decrypted = sum(report.tls_not_decrypted.values())
        lines.append(f"  TLS connections: {report.tls_connections}, {report.tls_connections - not_decrypted} decrypted"
                     + (f", {not_decrypted} not decrypted (" + "; ".join(
                         f"{n}: {why}" for why, n in report.tls_not_decrypted.most_common()) + ")"
                        if not_decrypted else ""))
    total = sum(report.frames_by_method.values())
    if total:
        top = ", ".join(f"{printable(name)} {n:,}" for name, n in report.frames_by_method.most_common(8))
        lines.append(f"  frames: {total:,} ({top}{', ...' if len(report.frames_by_method) > 8 else ''})")
    lines.append(f"  capture gaps: {report.gaps}   errors: {len(report.errors)}"
                 + ("   FILE DAMAGED: kept what came before the damage" if report.damaged else ""))
    if report.committed_with:
        lines.append(f"  one capture with the files after it: its rows are counted with {printable(report.committed_with)}")
    else:
        lines.append(f"  wrote {report.rows:,} frame rows to {printable(os.path.join(lake_dir, 'frames'))}"
                     + (f" (version {report.frames_version})" if report.frames_version is not None else "")
                     + f" in {report.seconds:.2f}s")
    if report.continued_connections:
        lines.append(f"  continued {report.continued_connections} open connection(s) of capture source "
                     f"{printable(report.source)}")
    return "\n".join(lines) + notes


def run_summary(args) -> int:
    from .summary import lake_summary, render_summary

    summary = lake_summary(args.lake)
    print(json.dumps(summary, sort_keys=True, default=str) if args.json else render_summary(summary))
    return EXIT_OK


def sample_captures() -> list[str]:
    folder = resources.files("analyzer") / "samples"
    return sorted(str(p) for p in folder.iterdir() if p.name.endswith((".pcap", ".pcapng")))


def run_analyze(args) -> int:
    from spark_jobs.schedule import parse_interval
    from spark_jobs.session import DriverDidNotStart
    from analyzer.detectors.thresholds import Thresholds

    try:
        thresholds = Thresholds.from_pairs(args.threshold)
        every_s = None if args.every is None else parse_interval(args.every)
    except ValueError as exc:
        print(f"ackscope analyze: {exc}", file=sys.stderr)
        return 2
    for option, day in (("--since", args.since), ("--until", args.until)):
        try:
            day is None or date.fromisoformat(day)
        except ValueError:
            print(f"ackscope analyze: {option} {day!r} is not a UTC day (YYYY-MM-DD)", file=sys.stderr)
            return 2
    if args.full and (args.since or args.until):
        print("ackscope analyze: --full analyses every day: it takes no --since/--until", file=sys.stderr)
        return 2
    if every_s is not None and (args.full or args.since or args.until):
        print("ackscope analyze: --every schedules incremental runs: it takes no --full, --since or --until "
              "(run those once, without --every)", file=sys.stderr)
        return 2
    if args.bucket_seconds < 1 or args.overdue_seconds <= 0:
        print("ackscope analyze: --bucket-seconds and --overdue-seconds must be positive", file=sys.stderr)
        return 2
    if every_s is None and not _has_frames(args.lake):
        print(f"ackscope analyze: no frames table in {args.lake}: run `ackscope ingest` first", file=sys.stderr)
        return 2
    plan = _planned(args, thresholds) if every_s is None else None
    driver = _Driver(args)
    try:
        if every_s is None:
            return _analyze_once(args, driver, thresholds, plan=plan)
        try:
            driver.session()   # a long-lived driver: its JVM warm for the runs that need Spark
        except DriverDidNotStart as exc:  # no java, a bad --driver-memory: the JVM's own words
            print(f"ackscope analyze: {exc}", file=sys.stderr)
            return EXIT_ANALYSIS_FAILED
        return _analyze_every(args, driver, thresholds, every_s)
    finally:
        driver.stop()


class _Driver:
    """The command's Spark session, started when a run first needs one: a run the local executor
    makes (spark_jobs/analyze.py's `local_takes`) starts no JVM."""

    def __init__(self, args):
        self.args, self.spark = args, None

    def session(self):
        from spark_jobs.session import get_spark

        if self.spark is None:
            self.spark = get_spark(self.args.master, "ackscope-analyze", driver_memory=self.args.driver_memory)
        return self.spark

    def stop(self) -> None:
        from spark_jobs.schedule import driver_alive

        if self.spark is not None and driver_alive(self.spark):  # a JVM that is gone has nothing to stop
            self.spark.stop()


def _planned(args, thresholds):
    """A run, planned before anything starts: its executor and a driver JVM's size are chosen on
    it, and the run then analyses that plan; None where planning fails (the run plans itself, and
    reports what stops it)."""
    from spark_jobs.analyze import planned_run

    try:
        return planned_run(args.lake, args.since, args.until, args.full, args.bucket_seconds,
                           int(args.overdue_seconds * 1e9), thresholds)
    except Exception:  # noqa: BLE001 - see above
        return None


def _local_master(args) -> bool:
    """Is the master local? The local executor makes the runs of few frame rows only where this
    machine is the one the run was given; on a cluster every run with new frames runs there, and
    only a run with nothing new stays in the driver."""
    from spark_jobs.session import is_local, resolved_master

    return is_local(resolved_master(args.master))


def _has_frames(lake: str) -> bool:
    from .lake import is_dir

    return is_dir(os.path.join(lake, "frames"))


def _analyze_once(args, driver: _Driver, thresholds, scheduled: bool = False, plan=None) -> int:
    """One run, its push and its output (_reported). `plan`: the command's, made before the run
    (None: the run plans itself)."""
    from spark_jobs.analyze import analyze
    from spark_jobs.session import DriverDidNotStart, ObjectStoreUnavailable

    try:
        report = analyze(driver.session, args.lake, since=args.since, until=args.until, delta_mode=args.delta_mode,
                         thresholds=thresholds, bucket_seconds=args.bucket_seconds,
                         overdue_ns=int(args.overdue_seconds * 1e9), full=args.full, progress=sys.stderr,
                         plan=plan, local=_local_master(args), local_up_to=args.local_up_to)
    except DriverDidNotStart as exc:  # no java, a bad --driver-memory: the JVM's own words
        print(f"ackscope analyze: {exc}", file=sys.stderr)
        return EXIT_ANALYSIS_FAILED
    except ObjectStoreUnavailable as exc:  # a configuration error, found before the run starts
        print(f"ackscope analyze: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the job's own failure, reported once, with its cause
        return _failed(args, exc, spark_log=driver.spark is not None)
    return _reported(args, report, scheduled)


def _failed(args, exc: Exception, spark_log: bool) -> int:
    """A failed run: said once with its cause (and where Spark's log is, when Spark ran), and pushed."""
    from spark_jobs.session import spark_log_path

    print(f"ackscope analyze: the analysis of {printable(args.lake)} failed: {printable(exc, LINE_LIMIT)}"
          + (f"\n  Spark's log: {spark_log_path()}" if spark_log else ""), file=sys.stderr)
    if args.pushgateway:
        _push_after_analysis(args, failed=True)
    return EXIT_ANALYSIS_FAILED


def _reported(args, report, scheduled: bool = False) -> int:
    """A finished run's push and output: the report, and the findings table unless `scheduled`
    (each scheduled run prints its report; --json: one JSON object a line)."""
    from spark_jobs.analyze import render_report

    from .findings import read_findings, render_findings

    if args.pushgateway and not _push_after_analysis(args, failed=False):
        return EXIT_PUSH_FAILED
    if args.json:
        print(json.dumps(report.as_json(), sort_keys=True), flush=True)
    else:
        print(render_report(report))
        print(flush=True)
        if not scheduled:
            print(render_findings(read_findings(args.lake)))
    return EXIT_OK


def _analyze_every(args, driver: _Driver, thresholds, every_s: float) -> int:
    """Runs on spark_jobs/schedule.py's schedule until a signal stops them (exit 0), the settings
    turn out wrong (2), or the driver is gone (EXIT_ANALYSIS_FAILED); a run that fails otherwise is
    reported (and pushed) and the next one runs at its time."""
    from spark_jobs.schedule import close_gone_driver, driver_alive, run_every, stop_on_signals

    exit_status = EXIT_OK

    def one_run() -> bool:
        nonlocal exit_status
        if not _has_frames(args.lake):  # the agent has not committed its first frames yet
            print(f"ackscope analyze: no frames table in {args.lake} yet: the next run at its time",
                  file=sys.stderr, flush=True)
            return True
        status = _analyze_once(args, driver, thresholds, scheduled=True, plan=_planned(args, thresholds))
        if status == 2:
            exit_status = status
            return False
        if not driver_alive(driver.spark):  # whatever the run's status: the local executor's needs no Spark job
            close_gone_driver(driver.spark)
            print("ackscope analyze: the Spark driver is gone: stopping", file=sys.stderr, flush=True)
            exit_status = EXIT_ANALYSIS_FAILED
            return False
        return True

    print(f"ackscope analyze: a run of {args.lake} every {every_s:g}s; SIGTERM or Ctrl-C stops after the "
          "run in progress", file=sys.stderr, flush=True)
    with stop_on_signals() as stopping:
        run_every(every_s, one_run, stopping)
    return exit_status


def add_push_options(parser, url_option: str, job_option: str, url_help: str, required: bool = False) -> None:
    from .metric_names import DEFAULT_PUSH_JOB

    parser.add_argument(url_option, dest="pushgateway", required=required, metavar="URL", help=url_help)
    parser.add_argument(job_option, dest="push_job", default=DEFAULT_PUSH_JOB, metavar="NAME",
                        help="the job of the pushed group (default %(default)s)")


def run_push(args) -> int:
    from .lake import is_dir
    from .push import PushError, lake_label, push

    if not is_dir(args.lake):
        print(f"ackscope push: no lake at {args.lake}", file=sys.stderr)
        return 2
    try:
        pushed = push(args.lake, args.pushgateway, args.push_job)
    except PushError as exc:
        print(f"ackscope push: {exc}", file=sys.stderr)
        return EXIT_PUSH_FAILED
    print(f"pushed {pushed.samples} samples of {args.lake} to {args.pushgateway} "
          f"(job={args.push_job}, lake={lake_label(args.lake)})")
    if pushed.folded:
        print("  the label caps folded series into vhost or application \"other\": "
              + ", ".join(f"{name} {n}" for name, n in sorted(pushed.folded.items())), file=sys.stderr)
    return EXIT_OK


def _push_after_analysis(args, failed: bool) -> bool:
    from .push import PushError, push, push_failure

    try:
        push_failure(args.lake, args.pushgateway, args.push_job) if failed else push(
            args.lake, args.pushgateway, args.push_job)
    except PushError as exc:
        print(f"ackscope analyze: {exc}", file=sys.stderr)
        return False
    return True


def run_findings(args) -> int:
    from .findings import findings_json, read_findings, render_findings

    rows = read_findings(args.lake, args.kind)
    print(json.dumps(findings_json(rows), sort_keys=True) if args.json else render_findings(rows))
    return EXIT_OK


def run_report(args) -> int:
    from .lake import UnreadableFile
    from .report import LakeMissing, write_report

    try:
        size = write_report(args.lake, args.output)
    except LakeMissing as exc:
        print(f"ackscope report: {printable(exc, LINE_LIMIT)}", file=sys.stderr)
        return 2
    except UnreadableFile:
        raise  # the lake's, not the output's: said by run_command
    except OSError as exc:  # the output cannot be written (a folder, no permission, disk full)
        print(f"ackscope report: cannot write {printable(args.output)}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote the report to {args.output} ({size / 1024:,.0f} KiB): open it in a browser")
    return EXIT_OK


def run_demo(args) -> int:
    samples = sample_captures()
    print(f"ackscope demo: ingesting {len(samples)} bundled sample capture(s) into {args.lake}\n")
    status = run_ingest(argparse.Namespace(files=samples, lake=args.lake, json=False, agent_id="demo",
                                           ports=",".join(str(p) for p in sorted(DEFAULT_BROKER_PORTS)),
                                           max_frame_size=DEFAULT_MAX_FRAME, progress=False, workers=1,
                                           tls_keylog=[], source=None, continue_within=DEFAULT_CONTINUE_WITHIN_S))
    if status != EXIT_OK:
        return status
    print(f"\nackscope demo: analysing {args.lake} (master {args.master})\n")
    status = run_analyze(argparse.Namespace(lake=args.lake, master=args.master, driver_memory=None, since=None,
                                            until=None, full=False, delta_mode="auto", threshold=[],
                                            bucket_seconds=10, overdue_seconds=60.0, json=False, pushgateway=None,
                                            push_job=None, every=None, local_up_to=None))
    if status != EXIT_OK:
        return status
    print("\nackscope demo: ", end="")
    return run_report(argparse.Namespace(lake=args.lake, output=os.path.join(args.lake, "report.html")))


if __name__ == "__main__":
    sys.exit(main())
