"""The report page: sections as small functions returning HTML, assembled by `render_page`.

Everything that comes from the lake goes through `escape` (names, texts, evidence), including
attribute values. The page carries its own styles and a few lines of script (severity filter,
sortable connection table) and is complete without the script.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, timezone
from html import escape

from ..finding_advice import ADVICE
from . import charts
from .evidence import evidence_rows
from .lake_view import LakeView, evidence_of
from .svg import BLUE, GREEN, duration
from .words import clock, place_name, who

MAX_FINDINGS = 200       # findings shown in full; the rest are counted (`ackscope findings` lists all)
MAX_CONNECTIONS = 300    # rows of the connections table
MAX_CHANNEL_CHARTS = 4   # unacked / unconfirmed pictures: channels with findings first, then the busiest
MAX_LOOP_CHARTS = 3      # requeue-looping messages drawn
MAX_ORDER_CHARTS = 2     # per-channel out-of-order pictures
SEVERITIES = ("critical", "warning", "info")


def render_page(view: LakeView, generated_ns: int) -> str:
    body = [_header(view, generated_ns)]
    if not view.ingested:
        body.append(_notice("This lake holds no tables yet.",
                            f"Run <code>ackscope ingest FILE... --lake {escape(view.lake_dir)}</code>, then "
                            f"<code>ackscope analyze --lake {escape(view.lake_dir)}</code>, then this report again."))
    elif not view.analysed:
        body.append(_notice("This lake has not been analysed yet: there are no findings or pictures.",
                            f"Run <code>ackscope analyze --lake {escape(view.lake_dir)}</code>, then this report "
                            "again. The connections decoded so far are below."))
    if view.analysed:
        body += [_findings(view), _pictures(view)]
    if view.ingested:
        body.append(_connections(view))
    body.append('<footer>Written by <code>ackscope report</code>; every number here is read from the Delta '
                'tables of the lake. Message bodies and credentials are never stored in the lake.</footer>')
    return PAGE.format(title=escape(f"ackscope report: {view.lake_dir}"), style=STYLE, script=SCRIPT,
                       body="\n".join(body))


def _notice(headline: str, detail: str) -> str:
    return f'<section class="notice"><h2>{escape(headline)}</h2><p>{detail}</p></section>'


def code_words(text: str) -> str:
    """Escape a text and set its `backticked` words as code (the advice's markdown)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


# -- header --------------------------------------------------------------------------------------

def _header(view: LakeView, generated_ns: int) -> str:
    span = view.span_ns
    facts = [("lake", f"<code>{escape(view.lake_dir)}</code>")]
    if span:
        facts.append(("capture", f"{escape(clock(span[0], True))} → {escape(clock(span[1], True))} "
                                 f"({escape(duration(span[1] - span[0]))})"))
    amqp = sum(1 for c in view.connections if c["protocol"] == "amqp-0-9-1")
    facts.append(("traffic", f"{len(view.connections):,} connections ({amqp:,} AMQP 0-9-1), "
                             f"{view.frames:,} frame rows"))
    run = view.last_run
    if run:
        finished = run["finished_ts"] or run["started_ts"]
        facts.append(("analysis", escape(
            f"{finished:%Y-%m-%d %H:%M:%S} UTC, scope {run['scope']} ({run['reason']}), "
            f"{run['connections']:,} connections / {run['frames']:,} frames analysed; "
            f"{view.runs} run{'s' if view.runs != 1 else ''} in all")))
    elif view.analysed:
        facts.append(("analysis", "findings present; no run log"))
    else:
        facts.append(("analysis", "not analysed yet"))
    generated = datetime.fromtimestamp(generated_ns / 1e9, tz=timezone.utc)
    facts.append(("report written", f"{generated:%Y-%m-%d %H:%M:%S} UTC"))
    rows = "".join(f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in facts)
    return (f'<header><h1>ackscope report</h1><p class="lede">AMQP 0-9-1 traffic: what was lost, stuck, '
            f'looping or out of order, and what to do.</p><table class="facts">{rows}</table>'
            f'{_severity_summary(view) if view.analysed else ""}{_nav(view)}</header>')


def _severity_summary(view: LakeView) -> str:
    by_severity = Counter(f["severity"] for f in view.findings)
    by_kind = Counter((f["severity"], f["kind"]) for f in view.findings)
    tiles = []
    for severity in SEVERITIES:
        kinds = ", ".join(f"{escape(k)} {n}" for (s, k), n in sorted(by_kind.items()) if s == severity)
        tiles.append(f'<a class="tile sev-{severity}" href="#findings"><span class="n">{by_severity[severity]}'
                     f'</span><span class="what">{severity}</span><span class="kinds">{kinds or "none"}</span></a>')
    verdict = ("No findings: nothing lost, stuck or looping in this data." if not view.findings else
               f"{len(view.findings):,} finding{'s' if len(view.findings) != 1 else ''}, worst first below.")
    return f'<div class="tiles">{"".join(tiles)}</div><p class="verdict">{escape(verdict)}</p>'


def _nav(view: LakeView) -> str:
    links = ([("findings", "Findings"), ("pictures", "Pictures")] if view.analysed else []) + (
        [("connections", "Connections")] if view.ingested else [])
    return "<nav>" + " · ".join(f'<a href="#{a}">{t}</a>' for a, t in links) + "</nav>" if links else ""


# -- findings ------------------------------------------------------------------------------------

def _findings(view: LakeView) -> str:
    if not view.findings:
        return ('<section id="findings"><h2>Findings</h2><p class="empty">None. The analysis found nothing '
                'lost, stuck, looping or out of order.</p></section>')
    shown = view.findings[:MAX_FINDINGS]
    filters = "".join(f'<label><input type="checkbox" class="sev-filter" value="{s}" checked> {s}</label>'
                      for s in SEVERITIES)
    more = len(view.findings) - len(shown)
    tail = (f'<p class="more">{more:,} more findings not shown here: '
            f'<code>ackscope findings --lake {escape(view.lake_dir)}</code> lists them all.</p>' if more else "")
    return (f'<section id="findings"><h2>Findings <span class="count">{len(view.findings):,}</span></h2>'
            + _finding_index(view, shown) + f'<div class="filters" hidden>Show: {filters}</div>'
            + "".join(_finding(view, f, i) for i, f in enumerate(shown, 1)) + tail + "</section>")


def _finding_index(view: LakeView, shown: list[dict]) -> str:
    """One line per finding, linking to it: the whole list at a glance before the details."""
    rows = []
    for i, f in enumerate(shown, 1):
        severity = f["severity"] if f["severity"] in SEVERITIES else "info"
        where = f["connection_name"] or who(view.connection(f["connection_id"]), f["connection_id"] or "")
        where += f" · ch {f['channel']}" if f["channel"] else ""
        rows.append(f'<tr data-severity="{severity}"><td><span class="badge sev-{severity}">{severity}</span></td>'
                    f'<td><a href="#finding-{i}"><code>{escape(f["kind"] or "?")}</code></a></td>'
                    f'<td>{escape(where)}</td><td class="num">{f["count"] or 0:,}</td>'
                    f'<td>{escape(clock(f["first_ts_ns"]))}</td></tr>')
    return ('<table class="index"><thead><tr><th>severity</th><th>kind</th><th>where</th><th class="num">count</th>'
            f'<th>first seen (UTC)</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def _finding(view: LakeView, finding: dict, number: int) -> str:
    severity = finding["severity"] if finding["severity"] in SEVERITIES else "info"
    kind = finding["kind"] or "?"
    connection = view.connection(finding["connection_id"])
    where = escape(finding["connection_name"] or who(connection, finding["connection_id"] or ""))
    if finding["channel"]:
        where += f" · channel {finding['channel']}"
        if finding["incarnation"] and finding["incarnation"] > 1:
            where += f" (its incarnation {finding['incarnation']})"
    ends = escape(f"{finding['client'] or '?'} → {finding['server'] or '?'}")
    vhost = f" · vhost <code>{escape(connection['vhost'])}</code>" if connection and connection.get("vhost") else ""
    span = escape(f"{clock(finding['first_ts_ns'], True)} → {clock(finding['last_ts_ns'])}")
    measure = ""
    if finding["value"] is not None:
        measure = escape(f" · measured {finding['value']:.4g}" + (
            f" against threshold {finding['threshold']:.4g}" if finding["threshold"] is not None else ""))
    meaning, todo = ADVICE.get(kind, ("", ""))
    advice = ""
    if meaning:
        advice = (f'<div class="advice"><p><b>What it means:</b> {code_words(meaning)}</p>'
                  f'<p><b>What to do:</b> {code_words(todo)}</p></div>')
    evidence = "".join(f"<tr><th>{escape(label)}</th><td>{html}</td></tr>"
                       for label, html in evidence_rows(finding, evidence_of(finding)))
    if finding.get("message_identity"):
        evidence = (f"<tr><th>message</th><td><code>{escape(finding['message_identity'])}</code></td></tr>"
                    + evidence)
    return (f'<article class="finding sev-{severity}" id="finding-{number}" data-severity="{severity}">'
            f'<h3><span class="badge sev-{severity}">{severity}</span> <code class="kind">{escape(kind)}</code>'
            f' <span class="where">{where}</span><span class="count-of">×{finding["count"] or 0:,}</span></h3>'
            f'<p class="meta">{ends}{vhost} · {span}{measure}</p>'
            f'<p class="summary">{escape(finding["summary"] or "")}</p>{advice}'
            f'<details open><summary>Evidence</summary><table class="evidence">{evidence}</table>'
            f'<p class="id">finding_id <code>{escape(finding["finding_id"] or "")}</code></p></details></article>')


# -- pictures ------------------------------------------------------------------------------------

def _key(row: dict) -> tuple[str, int, int]:
    return row["connection_id"], row["channel"], row["incarnation"]


def _chosen_channels(view: LakeView, busy_column: str) -> list[tuple[tuple, str]]:
    """Channel incarnations worth a picture: those with findings (worst first), then the busiest."""
    active = {_key(c): c for c in view.channels if (c[busy_column] or 0) > 0}
    chosen: dict[tuple, str] = {}  # key -> why, in order
    for f in view.findings:
        if _key(f) in active:
            chosen.setdefault(_key(f), f"{f['severity']} {f['kind']}")
    for row in sorted(active.values(), key=lambda c: -(c[busy_column] or 0))[:MAX_CHANNEL_CHARTS]:
        chosen.setdefault(_key(row), f"busiest: {row[busy_column]:,} {busy_column}")
    return list(chosen.items())[:MAX_CHANNEL_CHARTS]


def _figure(svg: str | None, caption: str) -> str:
    if svg is None:
        return ""
    return f'<figure>{svg}<figcaption>{caption}</figcaption></figure>'


def _pictures(view: LakeView) -> str:
    parts = ['<section id="pictures"><h2>Pictures</h2>']
    parts.append(_channel_pictures(view, "deliveries", charts.unacked_chart, "Unacked deliveries",
                                   "Manual-ack deliveries not yet acked, nacked or rejected, against the prefetch "
                                   "limit in force. A line pinned at the limit is a stalled consumer; one that "
                                   "only grows, a consumer that does not ack. Shaded: where a finding is."))
    parts.append(_channel_pictures(view, "publishes", charts.unconfirmed_chart, "Unconfirmed publishes",
                                   "Confirm-mode publishes awaiting the broker's basic.ack/nack. Crosses: publishes "
                                   "lost (the channel ended first) or nacked."))
    parts.append(_latency_pictures(view))
    parts.append(_order_pictures(view))
    parts.append(_loop_pictures(view))
    parts.append("</section>")
    return "".join(parts)


def _channel_pictures(view: LakeView, busy_column: str, chart, heading: str, explain: str) -> str:
    figures = []
    for key, why in _chosen_channels(view, busy_column):
        name = place_name(view, key)
        svg = chart(view, key, f"{heading}: {name}")
        figures.append(_figure(svg, f"<b>{escape(name)}</b> <span class='why'>({escape(why)})</span>"))
    figures = [f for f in figures if f]
    body = "".join(figures) or '<p class="empty">No channel in this lake had any.</p>'
    return f'<h3>{escape(heading)} over time</h3><p class="explain">{escape(explain)}</p>{body}'


def _latency_pictures(view: LakeView) -> str:
    confirm = charts.latency_chart(charts.confirm_latency(view), "Confirm latency", "confirm", BLUE)
    ack = charts.latency_chart(charts.ack_latency(view), "Ack latency", "ack", GREEN)
    missing = [what for what, svg in (("confirmed publishes", confirm), ("acked deliveries (manual ack)", ack))
               if svg is None]
    note = f'<p class="empty">No {" and no ".join(missing)} in this lake.</p>' if missing else ""
    body = (_figure(confirm, "From <code>basic.publish</code> to the broker's <code>basic.ack</code>/"
                             "<code>basic.nack</code>: persistent messages wait for the disk, so hundreds of "
                             "milliseconds under load are normal.")
            + _figure(ack, "From <code>basic.deliver</code> to the consumer's <code>basic.ack</code>: how long "
                           "handlers hold messages."))
    return "<h3>Confirm and ack latency</h3>" + body + note


def _order_pictures(view: LakeView) -> str:
    svg, late, total = charts.out_of_order_chart(view)
    if svg is None:
        return '<h3>Publish-to-confirm order</h3><p class="empty">No confirmed publishes in this lake.</p>'
    share = f"{late:,} of {total:,} confirmed publishes ({100 * late / total:.1f}%) were confirmed out of order."
    figures = [_figure(svg, escape(share) + " The protocol allows it (persistent messages wait for the disk); "
                                            "it matters only to a publisher that matches confirms by position.")]
    keys = []
    for f in view.findings:
        if f["kind"] == "out_of_order_confirm" and _key(f) not in keys:
            keys.append(_key(f))
    for key in keys[:MAX_ORDER_CHARTS]:
        name = place_name(view, key)
        figures.append(_figure(charts.out_of_order_scatter(view, key, f"Confirm order: {name}"),
                               f"<b>{escape(name)}</b>: each confirmed publish by its number, raised by how many "
                               "earlier publishes were still unconfirmed when its confirm came."))
    return "<h3>Publish-to-confirm order</h3>" + "".join(figures)


def _loop_pictures(view: LakeView) -> str:
    loops = [f for f in view.findings if f["kind"] == "requeue_loop" and f.get("message_identity")]
    if not loops:
        return ""
    figures = []
    for finding in loops[:MAX_LOOP_CHARTS]:
        svg, drawn, total = charts.requeue_loop_chart(view, finding)
        cut = f" The first {drawn:,} of its {total:,} deliveries are drawn." if drawn < total else ""
        figures.append(_figure(svg, escape(f"{total:,} deliveries of {finding['message_identity']}, one row per "
                                           f"channel it was delivered on; hover a mark for its tag.{cut}")))
    more = len(loops) - MAX_LOOP_CHARTS
    tail = f'<p class="more">{more:,} more looping messages: see their findings.</p>' if more > 0 else ""
    return "<h3>Requeue loops</h3>" + "".join(figures) + tail


# -- connections ---------------------------------------------------------------------------------

def ending(c: dict) -> str:
    """How a connection ended, in words."""
    how = c.get("ended_by")
    if how == "connection.close":
        text = f"connection.close by {c.get('closed_by') or '?'}"
        if c.get("close_text"):
            return f"{text}: {c.get('close_code')} {c['close_text']}"
        return text + (f" (code {c['close_code']})" if c.get("close_code") is not None else "")
    return {"tcp.fin": "TCP FIN (no connection.close)", "tcp.rst": "TCP RST (reset)",
            "end-of-capture": "open at the end of the capture", None: "open at the end of the capture"
            }.get(how, how)


def _connections(view: LakeView) -> str:
    findings_of = Counter(f["connection_id"] for f in view.findings)
    worst = {}
    for f in view.findings:
        worst.setdefault(f["connection_id"], f["severity"])
    ordered = sorted(view.connections, key=lambda c: (-findings_of[c["connection_id"]], c["first_ts_ns"] or 0))
    shown = ordered[:MAX_CONNECTIONS]
    header = ("connection", "user · vhost", "client → server", "opened (UTC)", "ended", "frames →/←", "gaps",
              "findings")
    rows = []
    for c in shown:
        product = " ".join(x for x in (c["client_product"], c["client_version"]) if x) or "client product not seen"
        if c["protocol"] != "amqp-0-9-1":
            product = f"not AMQP 0-9-1 ({c['protocol']})"
        name = f'<b>{escape(c["connection_name"])}</b>' if c["connection_name"] else \
            '<span class="product">no connection_name</span>'
        opened = escape(clock(c["first_ts_ns"])) + (
            "" if c["started_at_syn"] else '<br><span class="product">joined mid-stream</span>')
        n = findings_of[c["connection_id"]]
        badge = (f'<span class="badge sev-{worst[c["connection_id"]]}">{n}</span>' if n else "0")
        ended = ending(c)
        bad = ended.startswith("TCP RST") or (c.get("close_code") or 200) not in (0, 200)
        account = escape(c["user"] or "–") + (f" · <code>{escape(c['vhost'])}</code>" if c["vhost"] is not None else "")
        client, server = f"{c['client_addr']}:{c['client_port']}", f"{c['server_addr']}:{c['server_port']}"
        cells = [f'{name}<br><span class="product">{escape(product)}</span>',
                 account,
                 f'<span class="addr">{escape(client)}</span><br><span class="addr">→ {escape(server)}</span>',
                 opened, f'<span class="{"bad" if bad else ""}">{escape(ended)}</span>',
                 f"{c['frames_to_broker'] or 0:,} / {c['frames_to_client'] or 0:,}",
                 str(c["gaps"] or 0), badge]
        rows.append(f'<tr data-n="{n}">' + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    more = len(ordered) - len(shown)
    tail = f'<p class="more">{more:,} more connections not listed (those without findings, latest first cut).</p>' \
        if more else ""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    return (f'<section id="connections"><h2>Connections <span class="count">{len(view.connections):,}</span></h2>'
            f'<p class="explain">Connections with findings first. Server: '
            f'{escape(_servers(view))}.</p><div class="scroll"><table class="connections sortable">'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>{tail}</section>')


def _servers(view: LakeView) -> str:
    servers = Counter(" ".join(x for x in (c["server_product"], c["server_version"]) if x)
                      for c in view.connections if c["server_product"])
    return ", ".join(f"{name} ({n})" for name, n in servers.most_common(3)) or "not seen"


STYLE = """
:root { --ink:#1f2933; --muted:#616e7c; --line:#e4e7eb; --bg:#f7f8fa;
        --critical:#c62828; --warning:#e07b00; --info:#1d6fb8; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
       font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans","Liberation Sans",sans-serif; }
main { max-width:1120px; margin:0 auto; padding:24px 28px 48px; }
h1 { font-size:28px; margin:0; letter-spacing:-0.5px; }
h2 { font-size:22px; margin:36px 0 12px; padding-bottom:6px; border-bottom:2px solid var(--line); }
h3 { font-size:17px; margin:24px 0 6px; }
code { font:13px/1.4 "DejaVu Sans Mono",Menlo,Consolas,monospace; background:#eef1f4; padding:1px 4px;
       border-radius:3px; overflow-wrap:anywhere; }
header { background:#fff; border:1px solid var(--line); border-radius:8px; padding:20px 24px; }
.lede { color:var(--muted); margin:2px 0 12px; }
table.facts th { text-align:left; color:var(--muted); font-weight:600; padding:2px 18px 2px 0;
                 vertical-align:top; white-space:nowrap; }
table.facts td { padding:2px 0; }
.tiles { display:flex; gap:12px; margin:16px 0 8px; flex-wrap:wrap; }
.tile { flex:1; min-width:200px; display:block; text-decoration:none; color:var(--ink); background:#fff;
        border:1px solid var(--line); border-left:6px solid; border-radius:6px; padding:8px 14px; }
.tile .n { font-size:30px; font-weight:700; margin-right:8px; }
.tile .what { font-weight:600; text-transform:uppercase; letter-spacing:.5px; }
.tile .kinds { display:block; color:var(--muted); font-size:13px; }
.tile.sev-critical { border-left-color:var(--critical); } .tile.sev-critical .n { color:var(--critical); }
.tile.sev-warning { border-left-color:var(--warning); } .tile.sev-warning .n { color:var(--warning); }
.tile.sev-info { border-left-color:var(--info); } .tile.sev-info .n { color:var(--info); }
.verdict { font-weight:600; margin:6px 0; }
nav { margin-top:8px; } nav a { color:var(--info); }
.count { font-size:15px; color:var(--muted); font-weight:400; }
.badge { display:inline-block; color:#fff; font-size:12px; font-weight:700; text-transform:uppercase;
         letter-spacing:.4px; padding:1px 7px; border-radius:10px; vertical-align:2px; }
.badge.sev-critical { background:var(--critical); } .badge.sev-warning { background:var(--warning); }
.badge.sev-info { background:var(--info); }
article.finding { background:#fff; border:1px solid var(--line); border-left:6px solid; border-radius:6px;
                  padding:10px 16px 8px; margin:12px 0; }
article.sev-critical { border-left-color:var(--critical); } article.sev-warning { border-left-color:var(--warning); }
article.sev-info { border-left-color:var(--info); }
article.finding h3 { margin:2px 0 2px; font-size:16px; }
code.kind { font-size:15px; font-weight:700; background:none; padding:0; }
.where { font-weight:600; } .count-of { float:right; color:var(--muted); font-weight:600; }
.meta { color:var(--muted); font-size:13px; margin:0 0 6px; }
.summary { margin:4px 0 8px; }
.advice { background:#f4f6f8; border-radius:4px; padding:6px 12px; font-size:14px; }
.advice p { margin:3px 0; }
details summary { cursor:pointer; color:var(--muted); font-weight:600; margin-top:6px; }
table.evidence { border-collapse:collapse; font-size:13px; margin:4px 0; width:100%; }
table.evidence th { text-align:left; font-weight:600; color:var(--muted); white-space:nowrap; width:1%;
                    padding:2px 14px 2px 0; vertical-align:top; }
table.evidence td { padding:2px 0; }
.items code { display:inline-block; margin:0 4px 3px 0; }
.more, .hint, .why, .id { color:var(--muted); font-size:13px; }
.id { margin:2px 0; }
figure { background:#fff; border:1px solid var(--line); border-radius:6px; margin:10px 0 16px; padding:10px 12px; }
figcaption { font-size:13px; color:var(--muted); margin-top:4px; }
figcaption b { color:var(--ink); }
svg.chart { max-width:100%; height:auto; display:block; }
svg .tick { font-size:11px; fill:#52606d; } svg .axis { font-size:12px; fill:#3e4c59; }
svg .legend { font-size:12px; fill:#1f2933; } svg .note { font-size:12px; fill:#3e4c59; font-weight:600; }
.explain { color:var(--muted); margin:0 0 6px; }
.empty { color:var(--muted); font-style:italic; }
.notice { background:#fff8e1; border:1px solid #f0d58c; border-radius:6px; padding:4px 18px; margin:18px 0; }
.notice h2 { border:none; font-size:18px; margin:10px 0 0; }
.scroll { overflow-x:auto; }
table.connections { border-collapse:collapse; background:#fff; font-size:13px; width:100%;
                    border:1px solid var(--line); }
table.connections th { background:#eef1f4; text-align:left; padding:6px 8px; white-space:nowrap; }
table.connections td { padding:5px 8px; border-top:1px solid var(--line); vertical-align:top; }
table.connections .bad { color:var(--critical); font-weight:600; }
table.connections .product { color:var(--muted); font-size:12px; }
table.connections .addr, table.connections td:nth-child(4) { white-space:nowrap; }
table.connections td:first-child { min-width:230px; } table.connections td:nth-child(5) { min-width:200px; }
table.sortable.js th { cursor:pointer; }
table.index { border-collapse:collapse; background:#fff; border:1px solid var(--line); width:100%;
               font-size:14px; margin:6px 0 14px; }
table.index th { background:#eef1f4; text-align:left; padding:5px 10px; }
table.index td { padding:4px 10px; border-top:1px solid var(--line); }
table.index a { color:var(--ink); } table.index code { background:none; font-weight:700; }
.num { text-align:right; }
.filters { margin:6px 0; } .filters label { margin-right:14px; }
.hidden { display:none; }
footer { color:var(--muted); font-size:12px; margin-top:36px; border-top:1px solid var(--line); padding-top:8px; }
"""

# Optional niceties: filter findings by severity, sort the connections table by a column. The page is
# whole without them (everything is shown; the filter stays hidden unless this runs).
SCRIPT = """
(function () {
  var filters = document.querySelector('.filters');
  if (filters) {
    filters.hidden = false;
    filters.addEventListener('change', function () {
      var on = {};
      document.querySelectorAll('.sev-filter').forEach(function (box) { on[box.value] = box.checked; });
      document.querySelectorAll('article.finding, table.index tr[data-severity]').forEach(function (a) {
        a.classList.toggle('hidden', !on[a.dataset.severity]);
      });
    });
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    table.classList.add('js');
    table.querySelectorAll('th').forEach(function (th, column) {
      th.title = 'sort';
      th.addEventListener('click', function () {
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var down = th.dataset.down !== '1';
        th.dataset.down = down ? '1' : '0';
        rows.sort(function (a, b) {
          var x = a.cells[column].textContent, y = b.cells[column].textContent;
          var nx = parseFloat(x.replace(/,/g, '')), ny = parseFloat(y.replace(/,/g, ''));
          var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
          return down ? c : -c;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
})();
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>{title}</title>
<style>{style}</style>
</head>
<body><main>
{body}
</main>
<script>{script}</script>
</body>
</html>
"""
