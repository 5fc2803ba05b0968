"""The reference reading of a capture: tshark's AMQP dissector, one record per AMQP frame.

This is what lab captures are checked against (and what the analyzer can be compared with):
`read_capture(path)` runs tshark and returns a `Capture` of `Frame` records in wire order.

tshark's `-T fields` output cannot be used for this: one TCP segment carries many AMQP frames,
and a field such as delivery_tag is present on some of them only, so the n-th tag cannot be
matched to the n-th method. PDML keeps every AMQP frame as its own element, in order, and
shows field-table entries (client properties, message headers) that the other formats drop.
"""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field, replace
from pathlib import Path

from pamqp.commands import INDEX_MAPPING

from tests.lab import broker
from tests.lab.errors import LabError

FRAME_KINDS = {"1": "method", "2": "header", "3": "body", "8": "heartbeat"}
CONTENT_METHODS = {"basic.publish", "basic.deliver", "basic.get-ok", "basic.return"}
# Only these packets matter; pure TCP acks would just make the PDML bigger.
INTERESTING_PACKETS = "amqp || tcp.flags.fin == 1 || tcp.flags.reset == 1"
TABLE_FIELDS = {"client_properties", "server_properties", "headers", "arguments", "filter"}
FIELD_TABLE_ENTRY = re.compile(r"^(?P<key>.*?) \((?P<type>[^()]*)\)(?:: (?P<value>.*))?$", re.S)


def method_name(class_id: int, method_id: int) -> str:
    """'basic.get-ok' for (60, 71): the spelling of the AMQP spec, which DESIGN.md uses too."""
    command = INDEX_MAPPING.get((class_id << 16) | method_id)
    if command is None:
        return f"unknown.{class_id}.{method_id}"
    class_name, method = command.name.split(".")  # e.g. 'Basic', 'GetOk'
    return f"{class_name.lower()}.{re.sub(r'(?<!^)(?=[A-Z])', '-', method).lower()}"


@dataclass(frozen=True)
class Frame:
    """One AMQP frame as tshark decoded it. Argument and property values are tshark's `show`
    strings ("1"/"0" for booleans); field tables are nested dicts and lists of strings."""

    number: int  # packet number in the pcapng, 1-based, as tshark and Wireshark show it
    time: float  # epoch seconds
    stream: int  # tshark's tcp.stream index
    from_broker: bool
    channel: int
    kind: str  # method, header, body or heartbeat
    method: str = ""  # e.g. "basic.ack"; empty for other kinds
    args: dict = field(default_factory=dict)
    # For publish/deliver/get-ok/return: the properties of the content header that follows.
    properties: dict = field(default_factory=dict)

    @property
    def tag(self) -> int:
        return int(self.args["delivery_tag"])

    def flag(self, name: str) -> bool:
        return self.args.get(name) == "1"

    @property
    def message_id(self) -> str | None:
        return self.properties.get("message_id")


@dataclass(frozen=True)
class Stream:
    """One TCP connection to the broker as seen in the capture."""

    number: int
    client_port: int
    connection_name: str | None  # from connection.start-ok; None if the capture began later
    ended: bool  # a FIN or RST was captured, so the connection is known to be over
    end_time: float | None


@dataclass
class Capture:
    path: Path
    frames: list[Frame]
    streams: dict[int, Stream]

    def connection_name(self, frame: Frame) -> str | None:
        return self.streams[frame.stream].connection_name

    def stream_named(self, connection_name: str) -> Stream:
        matches = [s for s in self.streams.values() if s.connection_name == connection_name]
        if len(matches) != 1:
            raise LabError(f"{self.path}: expected one connection named {connection_name!r}, found {len(matches)}")
        return matches[0]

    def methods(self, name: str, *, from_broker: bool | None = None, connection_name: str | None = None,
                channel: int | None = None) -> list[Frame]:
        return [
            f for f in self.frames
            if f.method == name
            and (from_broker is None or f.from_broker == from_broker)
            and (connection_name is None or self.connection_name(f) == connection_name)
            and (channel is None or f.channel == channel)
        ]

    def heartbeats(self, *, from_broker: bool, connection_name: str) -> list[Frame]:
        return [f for f in self.frames if f.kind == "heartbeat" and f.from_broker == from_broker
                and self.connection_name(f) == connection_name]


def read_capture(path: Path | str, names_by_port: dict[int, str] | None = None) -> Capture:
    """Decode `path` with tshark. `names_by_port` names connections whose start-ok is not in the
    capture (it began mid-connection), keyed by client port."""
    path = Path(path)
    pdml = run_tshark(["-r", str(path), "-Y", INTERESTING_PACKETS, "-T", "pdml"], path)
    frames: list[Frame] = []
    stream_facts: dict[int, dict] = {}
    for packet in ElementTree.fromstring(pdml).iter("packet"):
        fields = _top_level_fields(packet, ("frame", "tcp"))
        number, time = int(fields["frame.number"]), float(fields["frame.time_epoch"])
        stream = int(fields["tcp.stream"])
        from_broker = int(fields["tcp.srcport"]) == broker.PORT
        facts = stream_facts.setdefault(stream, {
            "client_port": int(fields["tcp.dstport" if from_broker else "tcp.srcport"]),
            "connection_name": None, "ended": False, "end_time": None})
        if (fields.get("tcp.flags.fin") == "1" or fields.get("tcp.flags.reset") == "1") and not facts["ended"]:
            facts.update(ended=True, end_time=time)
        for proto in packet.findall("proto[@name='amqp']"):
            frame = _amqp_frame(proto, number, time, stream, from_broker)
            if frame is None:
                continue  # the protocol header, which is not a frame
            if frame.method == "connection.start-ok":
                facts["connection_name"] = frame.args["client_properties"].get("connection_name")
            frames.append(frame)
    frames = _attach_content_properties(frames)
    for facts in stream_facts.values():
        if facts["connection_name"] is None and names_by_port:
            facts["connection_name"] = names_by_port.get(facts["client_port"])
    streams = {n: Stream(number=n, **facts) for n, facts in stream_facts.items()}
    return Capture(path=path, frames=frames, streams=streams)


def read_lab_capture(out_dir: Path | str, scenario: str) -> tuple[Capture, dict]:
    """A scenario's capture and expectations as `python -m tests.lab run SCENARIO --out
    out_dir` left them; connections the capture joined mid-way are named from the facts."""
    expected = json.loads((Path(out_dir) / f"{scenario}.expected.json").read_text())
    names_by_port = {port: name for name, port in expected["facts"]["connections"].items()}
    return read_capture(Path(out_dir) / f"{scenario}.pcapng", names_by_port), expected


def run_tshark(args: list[str], path: Path) -> str:
    try:
        result = subprocess.run(["tshark", *args], capture_output=True, text=True, timeout=120)
    except FileNotFoundError as missing:
        raise LabError("tshark is not installed (apt-get install tshark)") from missing
    if result.returncode != 0:
        complaint = [line for line in result.stderr.splitlines() if "dangerous" not in line]  # root warning
        raise LabError(f"tshark could not read {path}: {' '.join(complaint).strip()}")
    return result.stdout


def _top_level_fields(packet: ElementTree.Element, protocols: tuple[str, ...]) -> dict[str, str]:
    fields = {}
    for proto in packet.findall("proto"):
        if proto.get("name") in protocols:
            for element in proto.iter("field"):
                fields.setdefault(element.get("name"), element.get("show"))
    return fields


def _amqp_frame(proto: ElementTree.Element, number: int, time: float, stream: int,
                from_broker: bool) -> Frame | None:
    children = {child.get("name"): child for child in proto.findall("field")}
    if "amqp.type" not in children:
        return None
    kind = FRAME_KINDS.get(children["amqp.type"].get("show"), "unknown")
    common = dict(number=number, time=time, stream=stream, from_broker=from_broker,
                  channel=int(children["amqp.channel"].get("show")), kind=kind)
    if kind == "method":
        name = method_name(int(children["amqp.method.class"].get("show")),
                           int(children["amqp.method.method"].get("show")))
        args = _named_values(children.get("amqp.method.arguments"), "amqp.method.arguments.")
        args.pop("response", None)  # the SASL credentials of connection.start-ok are never kept
        return Frame(**common, method=name, args=args)
    if kind == "header":
        properties = children.get("amqp.header.properties")
        return Frame(**common, properties=_named_values(properties, "amqp.method.properties."))
    return Frame(**common)


def _named_values(parent: ElementTree.Element | None, prefix: str) -> dict:
    """Direct child fields of `parent` by their short name; field tables become dicts."""
    values = {}
    for child in [] if parent is None else parent.findall("field"):
        name = child.get("name", "").removeprefix(prefix)
        # Other fields may have children too (tshark's expert info), but only tables have entries.
        values[name] = _field_table(child.findall("field")) if name in TABLE_FIELDS else child.get("show")
    return values


def _field_table(entries: list[ElementTree.Element]) -> dict | list:
    """tshark shows each entry as 'key (type): value', with nested tables and arrays as children."""
    parsed = {}
    for entry in entries:
        match = FIELD_TABLE_ENTRY.match(entry.get("showname", ""))
        if not match:
            continue
        nested = entry.findall("field")
        parsed[match["key"]] = _field_table(nested) if nested else (match["value"] or "")
    if parsed and all(re.fullmatch(r"\[\d+\]", key) for key in parsed):
        return list(parsed.values())
    return parsed


def _attach_content_properties(frames: list[Frame]) -> list[Frame]:
    """Give each content-carrying method the properties of its content header, so a publish or
    delivery carries its message_id and delivery_mode. Headers follow their method on the same
    channel and direction, possibly in a later TCP segment."""
    pending: dict[tuple[int, bool, int], int] = {}
    attached = list(frames)
    for index, frame in enumerate(frames):
        key = (frame.stream, frame.from_broker, frame.channel)
        if frame.method in CONTENT_METHODS:
            pending[key] = index
        elif frame.kind == "header" and key in pending:
            method_index = pending.pop(key)
            method = attached[method_index]
            attached[method_index] = replace(method, properties=frame.properties)
    return attached
