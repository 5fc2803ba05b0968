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

from .. import schema
from ..finding_advice import ADVICE
from ..findings import connection_ends
from . import charts
from .evidence import evidence_rows
from .lake_view import MAX_CONNECTIONS, LakeView, evidence_of
from .svg import BLUE, GREEN, duration
from .template import PAGE, SCRIPT, STYLE
from .words import clock, place_name, who

MAX_FINDINGS = 200       # findings shown in full; the rest are counted (`ackscope findings` lists all)
MAX_FINDING_CHANNELS = 4  # unacked / unconfirmed pictures: channels with findings (worst first) ...
MAX_BUSIEST_CHANNELS = 2  # ... and the busiest others, for what normal looks like
MAX_LOOP_CHARTS = 3      # requeue-looping messages drawn
MAX_ORDER_CHARTS = 2     # per-channel out-of-order pictures
SEVERITIES = tuple(reversed(schema.SEVERITIES))  # critical first


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
    facts.append(("traffic", f"{view.connection_count:,} connections ({view.amqp_connections:,} AMQP 0-9-1), "
                             f"{view.frames:,} frame rows"))
    run = view.last_run
    if run:
        finished = run["finished_ts"] or run["started_ts"]
        facts.append(("analysis", escape(
            f"{finished:%Y-%m-%d %H:%M:%S} UTC, scope {run['scope']} ({run['reason']}), "
            f"{run['connections'] or 0:,} connections / {run['frames'] or 0:,} frames analysed; "
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
    """One finding; the evidence of info findings starts folded (they are choices, not failures)."""
    severity = finding["severity"] if finding["severity"] in SEVERITIES else "info"
    kind = finding["kind"] or "?"
    connection = view.connection(finding["connection_id"])
    where = escape(finding["connection_name"] or who(connection, finding["connection_id"] or ""))
    if finding["channel"]:
        where += f" · channel {finding['channel']}"
        if finding["incarnation"] and finding["incarnation"] > 1:
            where += f" (its incarnation {finding['incarnation']})"
    client, server = connection_ends(finding)
    ends = escape(f"{client or '?'} → {server or '?'}")
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
            f'<details{"" if severity == "info" else " open"}><summary>Evidence</summary><table class="evidence">{evidence}</table>'
            f'<p class="id">finding_id <code>{escape(finding["finding_id"] or "")}</code></p></details></article>')


# -- pictures ------------------------------------------------------------------------------------

def _key(row: dict) -> tuple[str, int, int]:
    return row["connection_id"], row["channel"], row["incarnation"]


def _chosen_channels(view: LakeView, busy_column: str) -> list[tuple[tuple, str]]:
    """Channel incarnations worth a picture: those with findings (worst first), then the busiest."""
    active = {_key(c): c for c in view.channels if (c[busy_column] or 0) > 0}
    chosen: dict[tuple, str] = {}  # key -> why, in order
    for f in view.findings:
        if _key(f) in active and len(chosen) < MAX_FINDING_CHANNELS:
            chosen.setdefault(_key(f), f"{f['severity']} {f['kind']}")
    busiest = [c for c in sorted(active.values(), key=lambda c: -(c[busy_column] or 0)) if _key(c) not in chosen]
    for row in busiest[:MAX_BUSIEST_CHANNELS]:
        chosen[_key(row)] = f"busiest other: {row[busy_column]:,} {busy_column}"
    return list(chosen.items())


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
    more = view.connection_count - len(shown)
    tail = f'<p class="more">{more:,} more connections not listed (the later ones without findings).</p>' \
        if more else ""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    return (f'<section id="connections"><h2>Connections <span class="count">{view.connection_count:,}</span></h2>'
            f'<p class="explain">Connections with findings first. Server: '
            f'{escape(_servers(view))}.</p><div class="scroll"><table class="connections sortable">'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>{tail}</section>')


def _servers(view: LakeView) -> str:
    return ", ".join(f"{name} ({n:,})" for name, n in view.servers) or "not seen"
