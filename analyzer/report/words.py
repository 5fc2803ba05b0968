"""How the report writes times and places, in one spot so every section says them the same way."""

from __future__ import annotations

from datetime import datetime, timezone


def clock(ns: int | None, with_date: bool = False) -> str:
    """A UTC time to the millisecond: 20:27:11.304 (or 2026-11-21 20:27:11.304 UTC)."""
    if ns is None:
        return "–"
    moment = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    text = moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
    return f"{moment:%Y-%m-%d} {text} UTC" if with_date else text


def who(connection: dict | None, connection_id: str = "") -> str:
    """A connection as people know it: its connection_name, else client product and address."""
    if connection is None:
        return connection_id.split("@", 1)[0] or "unknown connection"
    if connection.get("connection_name"):
        return connection["connection_name"]
    product = connection.get("client_product") or "client"
    return f"{product} {connection.get('client_addr')}:{connection.get('client_port')}"


def place_name(view, key: tuple[str, int, int]) -> str:
    """A channel incarnation: 'orders-consumer ch 1' ('#2' for the second life of a channel number)."""
    connection_id, channel, incarnation = key
    name = f"{who(view.connection(connection_id), connection_id)} ch {channel}"
    return name + (f" #{incarnation}" if incarnation and incarnation > 1 else "")
