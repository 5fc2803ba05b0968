"""The TLS layer (analyzer/tls/) on real TLS conversations: OpenSSL on both ends in memory, the
client's real key log. Every suite a RabbitMQ broker and its clients negotiate, records cut
across segments or several in one, resumed sessions, a gap inside TLS, bad key logs."""

from __future__ import annotations

import ssl

import pytest

from analyzer.flow_state import FlowStateError
from analyzer.reassembly import Gap
from analyzer.tls import KeyLog, TlsLayer
from analyzer.tls.keylog import read_keylog
from tests.tls_sessions import Conversation, server_context

TLS12, TLS13 = ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3
# Python's ssl cannot pick a TLS 1.3 suite; the other two are decrypted in test_tls_lab.py (openssl s_client).
SUITES = [(TLS13, None, "TLS_AES_256_GCM_SHA384"),
          (TLS12, "ECDHE-RSA-AES128-GCM-SHA256", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
          (TLS12, "ECDHE-RSA-AES256-GCM-SHA384", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"),
          (TLS12, "ECDHE-RSA-CHACHA20-POLY1305", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
          (TLS12, "ECDHE-RSA-AES128-SHA256", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256"),
          (TLS12, "ECDHE-RSA-AES256-SHA384", "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA384"),
          (TLS12, "ECDHE-RSA-AES128-SHA", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA")]
MESSAGES = [(0, b"AMQP\x00\x00\x09\x01"), (1, b"start" * 100), (0, b"x" * 40_000), (1, b"y" * 17_000), (0, b"z")]


def talk(conversation: Conversation) -> None:
    for direction, data in MESSAGES:
        conversation.send(direction, data)


def decrypt(layer: TlsLayer, wire, chunk: int | None = None) -> list[bytes]:
    """Plaintext per direction, the wire fed in `chunk`-byte segments (None: as the ends wrote it)."""
    out = [b"", b""]
    for direction, data in wire:
        pieces = [data] if chunk is None else [data[i:i + chunk] for i in range(0, len(data), chunk)]
        for piece in pieces:
            for item in layer.feed(direction, [piece]):
                out[direction] += item if item.__class__ is bytes else b"<gap>"
    return out


def expected(direction: int) -> bytes:
    return b"".join(data for d, data in MESSAGES if d == direction)


def test_a_ciphersuite_name_table_covers_every_tested_suite():
    from analyzer.tls.keys import SUITES as TABLE
    assert {name for _, _, name in SUITES} <= {suite.name for suite in TABLE.values()}


@pytest.mark.parametrize("version,ciphers,name", SUITES, ids=[name for _, _, name in SUITES])
def test_every_suite_decrypts_whole_segments_and_split_records(tmp_path, version, ciphers, name):
    keylog_path = tmp_path / "keys.log"
    conversation = Conversation(keylog_path, version, ciphers)
    talk(conversation)
    keylog = read_keylog(str(keylog_path))
    for chunk in (None, 7, 1500):
        layer = TlsLayer(keylog)
        assert decrypt(layer, conversation.wire, chunk) == [expected(0), expected(1)], chunk
        facts = layer.facts()
        assert facts == {"tls_version": "TLSv1.3" if version == TLS13 else "TLSv1.2", "tls_cipher_suite": name,
                         "tls_sni": "broker.example", "tls_decrypted": True, "tls_note": None}


@pytest.mark.parametrize("version", [TLS12, TLS13], ids=["tls1.2", "tls1.3"])
def test_a_resumed_session_decrypts_with_its_own_key_line(tmp_path, version):
    keylog_path = tmp_path / "keys.log"
    server = server_context()
    first = Conversation(keylog_path, version, server=server)
    talk(first)
    resumed = Conversation(keylog_path, version, session=first.client.session, server=server,
                           client=first.client_context)
    talk(resumed)
    assert resumed.client.session_reused
    keylog = read_keylog(str(keylog_path))
    assert decrypt(TlsLayer(keylog), resumed.wire) == [expected(0), expected(1)]


def test_without_the_key_nothing_comes_out_and_the_reason_is_said(tmp_path):
    conversation = Conversation(tmp_path / "keys.log", TLS13)
    talk(conversation)
    for keylog, note in ((KeyLog(), "no key for that client random"), (None, "no key log given")):
        layer = TlsLayer(keylog)
        assert decrypt(layer, conversation.wire) == [b"", b""]
        assert layer.facts()["tls_decrypted"] is False and layer.facts()["tls_note"] == note
        assert layer.facts()["tls_version"] == "TLSv1.3" and layer.facts()["tls_sni"] == "broker.example"


def test_corrupted_key_lines_are_counted_and_never_shown(tmp_path):
    keylog_path = tmp_path / "keys.log"
    conversation = Conversation(keylog_path, TLS12, "ECDHE-RSA-AES128-GCM-SHA256")
    talk(conversation)
    marker = "5ec7e75ec7e7" * 8
    good = keylog_path.read_bytes()
    keylog = KeyLog()
    keylog.feed(b"CLIENT_RANDOM nothex " + marker.encode() + b"\n" + b"garbage " + marker.encode() + b"\n"
                + good[:50])
    keylog.feed(good[50:])  # a line cut between two reads is read whole
    keylog.end()
    assert keylog.corrupted == 2 and keylog.lines == 1
    assert marker not in repr(keylog)
    assert decrypt(TlsLayer(keylog), conversation.wire) == [expected(0), expected(1)]


@pytest.mark.parametrize("version", [TLS12, TLS13], ids=["tls1.2", "tls1.3"])
def test_a_gap_inside_tls_becomes_a_gap_in_the_plaintext_and_decryption_goes_on(tmp_path, version):
    keylog_path = tmp_path / "keys.log"
    conversation = Conversation(keylog_path, version)
    talk(conversation)
    for n in range(20):
        conversation.send(0, b"after %d " % n * 50)
    keylog = read_keylog(str(keylog_path))
    wire = [(d, data) for d, data in conversation.wire]
    # The client's 40,000 bytes travel in three records: lose bytes from the middle of the second
    # one to the middle of the third, as a capture gap would.
    big = next(i for i, (d, data) in enumerate(wire) if d == 0 and len(data) > 30_000)
    layer = TlsLayer(keylog)
    out = [b"", b""]
    for i, (direction, data) in enumerate(wire):
        items = [data] if i != big else [data[:20_000], Gap(10_000, "lost"), data[30_000:]]
        for item in layer.feed(direction, items):
            out[direction] += item if item.__class__ is bytes else b"<gap>"
    client = out[0]
    assert b"<gap>" in client
    before, after = client.split(b"<gap>", 1)
    assert expected(0).startswith(before)  # nothing false before the gap
    assert after.endswith(b"".join(b"after %d " % n * 50 for n in range(20)))  # found its footing again
    assert b"<gap>" not in after and after in expected(0) + b"".join(b"after %d " % n * 50 for n in range(20))
    assert layer.facts()["tls_decrypted"] is True


def test_garbage_after_a_gap_stops_the_direction_without_inventing_plaintext(tmp_path):
    keylog_path = tmp_path / "keys.log"
    conversation = Conversation(keylog_path, TLS13)
    talk(conversation)
    keylog = read_keylog(str(keylog_path))
    layer = TlsLayer(keylog)
    decrypt(layer, conversation.wire)
    # After a gap, a plausible record header whose record does not open with any sequence number.
    fake = bytes((23, 3, 3, 0, 40)) + bytes(40)
    out = layer.feed(0, [Gap(100, "lost"), fake + fake])
    assert all(item.__class__ is not bytes for item in out)
    assert layer.stopped[0] and layer.failures == 1


def test_the_snapshot_holds_no_secret_and_restores_to_decrypt_the_rest(tmp_path):
    keylog_path = tmp_path / "keys.log"
    conversation = Conversation(keylog_path, TLS13)
    talk(conversation)
    cut = len(conversation.wire)
    conversation.send(0, b"later" * 1000)
    conversation.send(1, b"answer" * 10)
    keylog = read_keylog(str(keylog_path))
    layer = TlsLayer(keylog)
    first = decrypt(layer, conversation.wire[:cut])
    wire_rest = conversation.wire[cut:]
    # cut the next record in two: the first half stays in the snapshot
    d, data = wire_rest[0]
    layer.feed(d, [data[:100]])
    doc = layer.snapshot()
    text = repr(doc)
    for secrets in keylog._secrets.values():
        for secret in secrets.values():
            assert secret.hex() not in text and secret.hex().upper() not in text
    restored = TlsLayer.restore(doc, keylog)
    rest = [b"", b""]
    for direction, data in [(d, data[100:])] + wire_rest[1:]:
        for item in restored.feed(direction, [data]):
            rest[direction] += item
    assert first[0] + rest[0] == expected(0) + b"later" * 1000
    assert first[1] + rest[1] == expected(1) + b"answer" * 10
    # without the key: restored as not decrypted, as in a single file
    assert TlsLayer.restore(doc, KeyLog()).facts()["tls_note"] == "no key for that client random"
    bad = dict(doc, client_random="zz")
    with pytest.raises(FlowStateError, match="client_random"):
        TlsLayer.restore(bad, keylog)


def test_records_held_for_a_late_key_are_decrypted_when_it_comes_and_dropped_past_the_bound(tmp_path):
    keylog_path = tmp_path / "keys.log"
    conversation = Conversation(keylog_path, TLS12, "ECDHE-RSA-AES128-GCM-SHA256")
    talk(conversation)
    late = KeyLog(growing=True, hold_ns=5_000, hold_bytes=1 << 20)
    layer = TlsLayer(late)
    assert decrypt(layer, conversation.wire) == [b"", b""]
    assert layer.facts()["tls_note"] == "no key for that client random (yet)"
    late.feed(keylog_path.read_bytes())
    layer.retry(1_000)
    plain = [b"", b""]
    for direction, _, _, items in layer.replay:
        plain[direction] += b"".join(items)
    assert plain == [expected(0), expected(1)]

    never = KeyLog(growing=True, hold_ns=5_000, hold_bytes=1 << 20)
    layer = TlsLayer(never)
    decrypt(layer, conversation.wire)
    layer.retry(10_000)
    assert layer.facts()["tls_note"] == "no key for that client random" and not layer.replay


def test_a_gap_in_the_tls12_handshake_after_the_hellos_is_found_past_and_the_data_decrypted(tmp_path):
    """The server's certificate flight lost: the ChangeCipherSpec and Finished with it. The first
    application data after the loss is found, its sequence number tried, and decrypted."""
    keylog_path = tmp_path / "keys.log"
    conversation = Conversation(keylog_path, TLS12, "ECDHE-RSA-AES128-GCM-SHA256")
    talk(conversation)
    keylog = read_keylog(str(keylog_path))
    layer = TlsLayer(keylog)
    out = [b"", b""]
    server_flights = [i for i, (d, _) in enumerate(conversation.wire) if d == 1]
    for i, (direction, data) in enumerate(conversation.wire):
        if i == server_flights[1]:  # the server's CCS and Finished (TLS 1.2 full handshake)
            items = [Gap(len(data), "lost")]
        else:
            items = [data]
        for item in layer.feed(direction, items):
            out[direction] += item if item.__class__ is bytes else b"<gap>"
    assert out[0] == expected(0)
    assert out[1].startswith(b"<gap>") and out[1][len(b"<gap>"):] == expected(1)
