"""One connection's TLS, both directions: stream bytes and gaps in, plaintext bytes and gaps out.

Sans-IO, the layer between reassembly and framing (helpers/FLOW_STATE.md). The hellos are read
in clear (client random, SNI, version, cipher suite); the keys come from the key log by client
random. Without them the connection is TLS *not decrypted*, with the reason, and nothing of its
content goes further: no frames, no findings, nothing guessed. Live, the key may come after the
first encrypted records (the client writes its line when its handshake ends): `wait_for_keys`
holds the records, bounded in bytes and time, and gives up past the bound.

A capture gap inside TLS loses whole or partial records: the plaintext gets a gap (the framer
hunts after it), the record reader hunts for the next record boundary, and the record's sequence
number is found again by trying the next few (AEAD and MAC checks make a wrong one fail, never
pass). Where that fails the direction stops decrypting, counted.
"""

from ..flow_state import Fields, encode_bytes
from ..reassembly import Gap
from .handshake import (CLIENT_HELLO, FINISHED, KEY_UPDATE, SERVER_HELLO, TLS12, TLS13, VERSION_NAMES,
                        HandshakeBuffer, HandshakeError, client_hello, server_hello)
from .keylog import CLIENT_RANDOM, KeyLog
from .keys import SUITES, Undecryptable, next_traffic_secret, suite_name, tls12_protections, tls13_protection
from .records import (APPLICATION_DATA, CHANGE_CIPHER_SPEC, HANDSHAKE, HEADER, MAX_RECORD, Lost, RecordReader,
                      plausible_header)
from .handshake import MAX_MESSAGE

HANDSHAKE_STATE, DECRYPTING, WAITING, NOT_DECRYPTED = "handshake", "decrypting", "waiting-for-key", "not-decrypted"
STATES = (HANDSHAKE_STATE, DECRYPTING, WAITING, NOT_DECRYPTED)
MAX_RESYNC_TRIES = 4096            # sequence numbers tried after a loss inside TLS
MIN_RECORD = 22                    # the smallest protected record that can hold a byte (TLS 1.3: 1 + 1 + tag 16; +5 header)
_SECRETS13 = {  # per direction: (handshake secret, first application secret)
    0: ("CLIENT_HANDSHAKE_TRAFFIC_SECRET", "CLIENT_TRAFFIC_SECRET_0"),
    1: ("SERVER_HANDSHAKE_TRAFFIC_SECRET", "SERVER_TRAFFIC_SECRET_0"),
}

# Why a TLS connection was not decrypted: the `tls_note` of its row.
NO_KEY_LOG = "no key log given"
NO_KEY = "no key for that client random"
NO_HANDSHAKE = "the capture missed the handshake"


def _joined(items: list) -> list:
    """Adjacent plaintext pieces as one: the framer cuts whole messages out of one piece at a time,
    and a record boundary (every 16 KiB) would otherwise split a frame and cost a copy to mend."""
    out, run = [], []
    for item in items:
        if item.__class__ is bytes:
            run.append(item)
            continue
        if run:
            out.append(b"".join(run) if len(run) > 1 else run[0])
            run = []
        out.append(item)
    if run:
        out.append(b"".join(run) if len(run) > 1 else run[0])
    return out


def looks_like_client_hello(data: bytes) -> bool:
    """A TLS handshake record holding a ClientHello: how a flow is found to be TLS on any port."""
    return len(data) >= 6 and data[0] == HANDSHAKE and data[1] == 3 and data[2] <= 4 and data[5] == CLIENT_HELLO


def looks_like_tls_records(data: bytes) -> bool:
    """The first bytes a capture that began mid-connection shows: an application-data record ending
    where the segment does, or followed by another (AMQP frames never start with 23)."""
    if len(data) < HEADER or not plausible_header(data, 0, hunting=True):
        return False
    end = HEADER + ((data[3] << 8) | data[4])
    return end == len(data) or (end + HEADER <= len(data) and plausible_header(data, end, hunting=True))


class TlsLayer:
    def __init__(self, keylog: KeyLog | None):
        self.keylog = keylog  # a growing one (live) makes the layer hold records for keys still to come
        self.readers = (RecordReader(), RecordReader())
        self.handshakes = (HandshakeBuffer(), HandshakeBuffer())
        self.client_random: bytes | None = None
        self.server_random: bytes | None = None
        self.sni: str | None = None
        self.version: int | None = None
        self.suite: int | None = None
        self.encrypt_then_mac = False
        self.state = HANDSHAKE_STATE
        self.note: str | None = None
        self.encrypted = [False, False]   # this direction's records are protected from here on
        self.application = [False, False]  # TLS 1.3: past this direction's Finished (application secrets)
        self.generation = [0, 0]          # TLS 1.3: KeyUpdates seen per direction
        self.stopped = [False, False]     # decryption of this direction stopped (counted in `failures`)
        self.lost = [0, 0]                # bytes lost since the last record opened: its seq must be found
        self.failures = 0
        self.records = 0
        self._protection: list = [None, None]
        self._secret: list = [None, None]  # TLS 1.3: the current traffic secret per direction (KeyUpdate)
        self._held: list = []              # (direction, ts_ns, packet, record or Lost) while waiting for a key
        self._held_bytes = 0
        self._held_since: int | None = None
        self._keylog_generation = -1
        self.replay: list = []             # (direction, ts_ns, packet, plaintext items) from held records

    def __repr__(self) -> str:
        return f"TlsLayer({self.version_name}, {self.state})"

    # -- what the connection row says ---------------------------------------------------------------

    @property
    def version_name(self) -> str | None:
        return VERSION_NAMES.get(self.version, f"0x{self.version:04X}") if self.version is not None else None

    def facts(self) -> dict:
        return {"tls_version": self.version_name, "tls_cipher_suite": suite_name(self.suite) if self.suite is not None else None,
                "tls_sni": self.sni, "tls_decrypted": self.state == DECRYPTING, "tls_note": self._note()}

    def _note(self) -> str | None:
        if self.state == DECRYPTING:
            return "decryption stopped after a loss or a record that did not open" if self.failures else None
        if self.state == HANDSHAKE_STATE:
            return NO_HANDSHAKE if self.client_random is None else "the handshake did not finish in the capture"
        if self.state == WAITING:
            return NO_KEY + " (yet)"
        return self.note

    # -- stream in, plaintext out -------------------------------------------------------------------

    def feed(self, direction: int, items: list, ts_ns: int = 0, packet: int = 0) -> list:
        """Stream items (bytes, reassembly.Gap) of one direction in; that direction's plaintext items
        (bytes, Gap) out. Records held for a key that arrives now come out in `replay`."""
        out: list = []
        reader = self.readers[direction]
        for item in items:
            found = reader.feed(item) if item.__class__ is bytes else reader.gap(item.nbytes)
            for record in found:
                self._record(direction, record, out, ts_ns, packet)
        if reader.dead and not self.stopped[direction] and self.state != NOT_DECRYPTED:
            if self.state == DECRYPTING:
                self._stop(direction, out)
            else:
                self._give_up("the stream is not TLS records")
        return _joined(out) if len(out) > 1 else out

    def retry(self, ts_ns: int) -> None:
        """Live: look for a held connection's key again (the key log grew), or give up past the bound."""
        if self.state == WAITING:
            self._look_up_keys(ts_ns)

    @classmethod
    def joined_late(cls, keylog: KeyLog | None) -> "TlsLayer":
        """A connection whose capture began after its handshake: its client random is unknown, so
        it cannot be decrypted. Recorded as TLS, not decrypted, instead of bytes nobody can read."""
        layer = cls(keylog)
        layer._give_up(NO_HANDSHAKE)
        return layer

    def stop_waiting(self) -> None:
        """The capture stops: a connection still waiting for its key will not get it."""
        if self.state == WAITING:
            self._give_up(NO_KEY)

    def _record(self, direction: int, record, out: list, ts_ns: int, packet: int) -> None:
        if record.__class__ is Lost:
            self._lost(direction, record, out, ts_ns, packet)
            return
        self.records += 1
        ctype, version, fragment = record
        if ctype == APPLICATION_DATA and self.state == DECRYPTING and self.encrypted[direction]:
            self._open(direction, record, out)  # the usual record once the handshake is done
            return
        if self.state == NOT_DECRYPTED or self.stopped[direction]:
            return
        if ctype == APPLICATION_DATA and self.version == TLS13 and self.server_random is not None:
            self.encrypted[direction] = True
        if not self.encrypted[direction]:
            if ctype == HANDSHAKE:
                self._clear_handshake(direction, fragment, ts_ns)
            elif ctype == CHANGE_CIPHER_SPEC and self.version != TLS13:
                self.encrypted[direction] = True  # TLS 1.2: the next record in this direction is the first protected one
            return
        if ctype == CHANGE_CIPHER_SPEC or (self.version == TLS13 and ctype != APPLICATION_DATA):
            return  # TLS 1.3: compatibility CCS, alerts in clear
        if self.state == WAITING:
            self._hold(direction, record, ts_ns, packet)
        elif self.state == DECRYPTING:
            self._open(direction, record, out)
        elif self.state == HANDSHAKE_STATE:  # protected records before any ServerHello we could read
            self._give_up(NO_HANDSHAKE)

    def _lost(self, direction: int, lost: Lost, out: list, ts_ns: int, packet: int) -> None:
        if self.state == WAITING:
            self._hold(direction, lost, ts_ns, packet)
            return
        if self.state == HANDSHAKE_STATE and not self.encrypted[direction]:
            self.handshakes[direction].buf = b""  # a hello cut by the gap cannot be read
            if self.client_random is None or self.server_random is None:
                self._give_up(NO_HANDSHAKE)
            return
        if self.state == DECRYPTING and not self.stopped[direction]:
            # After a loss the reader finds application data only, protected whatever was lost with
            # it (a TLS 1.2 ChangeCipherSpec too): the record after it is opened by trial of its seq.
            self.encrypted[direction] = True
            self.lost[direction] += lost.nbytes
            if out and out[-1].__class__ is Gap:  # a gap and the hunt after it: one gap in the plaintext
                out[-1] = Gap(out[-1].nbytes + lost.nbytes, out[-1].reason)
            else:
                out.append(Gap(lost.nbytes, f"tls: {lost.reason}"))

    def _clear_handshake(self, direction: int, fragment: bytes, ts_ns: int) -> None:
        for kind, body in self.handshakes[direction].feed(fragment):
            try:
                if kind == CLIENT_HELLO and direction == 0 and body is not None:
                    hello = client_hello(body)
                    self.client_random, self.sni = hello.random, hello.sni
                elif kind == SERVER_HELLO and direction == 1 and body is not None and self.client_random is not None:
                    hello = server_hello(body)
                    if hello.retry:
                        continue  # a HelloRetryRequest: the client says hello again, same random
                    self.server_random, self.version, self.suite = hello.random, hello.version, hello.cipher_suite
                    self.encrypt_then_mac = hello.encrypt_then_mac
                    self._look_up_keys(ts_ns)
            except HandshakeError:
                self._give_up(NO_HANDSHAKE)
                return

    # -- keys ---------------------------------------------------------------------------------------

    def _look_up_keys(self, ts_ns: int) -> None:
        if self.version not in (TLS12, TLS13):
            self._give_up(f"{self.version_name} is not decrypted (TLS 1.2 and 1.3 are)")
            return
        suite = SUITES.get(self.suite)
        if suite is None or (self.version == TLS13) != (self.suite >> 8 == 0x13):
            self._give_up(f"cipher suite {suite_name(self.suite)} is not supported")
            return
        if self.keylog is None:
            self._give_up(NO_KEY_LOG)
            return
        if self._keylog_generation == self.keylog.generation and self.state == WAITING:
            self._check_hold(ts_ns)
            return
        self._keylog_generation = self.keylog.generation
        if self._install_keys():
            self.state = DECRYPTING
            self._replay_held()
        elif self.keylog.growing:
            self.state = WAITING
            if self._held_since is None:
                self._held_since = ts_ns
            self._check_hold(ts_ns)
        else:
            self._give_up(NO_KEY)

    def _install_keys(self) -> bool:
        """Record protection for both directions from the key log, at the layer's place in the
        handshake (a restored layer may be past Finished and KeyUpdates). False without the keys."""
        secrets = self.keylog.secrets(self.client_random)
        suite = SUITES[self.suite]
        if self.version == TLS12:
            master = secrets.get(CLIENT_RANDOM)
            if master is None or len(master) != 48:
                return False
            self._protection = list(tls12_protections(suite, master, self.client_random, self.server_random,
                                                      self.encrypt_then_mac))
            return True
        if any(label not in secrets for pair in _SECRETS13.values() for label in pair):
            return False
        for direction, (handshake_label, application_label) in _SECRETS13.items():
            if self.application[direction]:
                secret = secrets[application_label]
                for _ in range(self.generation[direction]):
                    secret = next_traffic_secret(suite, secret)
            else:
                secret = secrets[handshake_label]
            self._secret[direction] = secret
            self._protection[direction] = tls13_protection(suite, secret)
        return True

    def _hold(self, direction: int, record, ts_ns: int, packet: int) -> None:
        self._held.append((direction, ts_ns, packet, record))
        self._held_bytes += record.nbytes if record.__class__ is Lost else len(record[2]) + 5
        self._look_up_keys(ts_ns)

    def _check_hold(self, ts_ns: int) -> None:
        if self._held_bytes > self.keylog.hold_bytes or ts_ns - self._held_since > self.keylog.hold_ns:
            self._give_up(NO_KEY)

    def _replay_held(self) -> None:
        held, self._held, self._held_bytes = self._held, [], 0
        for direction, ts_ns, packet, record in held:
            out: list = []
            if record.__class__ is Lost:
                self._lost(direction, record, out, ts_ns, packet)
            else:
                self._open(direction, record, out)
            if out:
                self.replay.append((direction, ts_ns, packet, out))

    def _give_up(self, note: str) -> None:
        self.state, self.note = NOT_DECRYPTED, note
        self._held, self._held_bytes = [], 0
        self._protection, self._secret = [None, None], [None, None]

    # -- records ------------------------------------------------------------------------------------

    def _open(self, direction: int, record: tuple, out: list) -> None:
        if self.stopped[direction]:
            return
        ctype, version, fragment = record
        protection = self._protection[direction]
        try:
            if self.lost[direction]:
                inner, plain = self._resync(protection, direction, record)
            else:
                inner, plain = protection.open(ctype, version, fragment)
        except Undecryptable:
            self._stop(direction, out)
            return
        if inner == APPLICATION_DATA:
            if plain:
                out.append(plain)
        elif inner == HANDSHAKE and self.version == TLS13:
            self._protected_handshake(direction, plain)

    def _resync(self, protection, direction: int, record: tuple) -> tuple[int, bytes]:
        """The first record after a loss: its sequence number is the next one plus the records lost,
        at most one per MIN_RECORD bytes lost."""
        tries = min(MAX_RESYNC_TRIES, self.lost[direction] // MIN_RECORD + 2)
        ctype, version, fragment = record
        for seq in range(protection.seq, protection.seq + tries):
            try:
                opened = protection.open(ctype, version, fragment, seq)
            except Undecryptable:
                continue
            self.lost[direction] = 0
            return opened
        raise Undecryptable("no sequence number opens the record after the loss")

    def _protected_handshake(self, direction: int, plain: bytes) -> None:
        suite = SUITES[self.suite]
        for kind, _ in self.handshakes[direction].feed(plain):
            if kind == FINISHED and not self.application[direction]:
                self._next_secret(direction, self.keylog.secrets(self.client_random)[_SECRETS13[direction][1]])
                self.application[direction] = True
            elif kind == KEY_UPDATE and self.application[direction]:
                self._next_secret(direction, next_traffic_secret(suite, self._secret[direction]))
                self.generation[direction] += 1

    def _next_secret(self, direction: int, secret: bytes) -> None:
        self._secret[direction] = secret
        self._protection[direction] = tls13_protection(SUITES[self.suite], secret)

    def _stop(self, direction: int, out: list) -> None:
        """This direction cannot be decrypted further: a gap in its plaintext, and nothing more."""
        self.stopped[direction] = True
        self.failures += 1
        out.append(Gap(0, "tls: decryption stopped"))

    # -- the native lane (native.py) -----------------------------------------------------------------

    @property
    def settled_in_python(self) -> bool:
        """Never to be taken by the native lane: not decrypted, or a direction stopped, for good."""
        return self.state == NOT_DECRYPTED or self.stopped[0] or self.stopped[1]

    def lane_openers(self) -> tuple | None:
        """For the native lane, which cuts the records of a connection past its handshake itself
        (analyzer/_lane.c): per direction, a function from an application-data record's fragment
        (record version 1.2) to its plaintext, or None, with nothing changed, for a record that is
        the layer's to read (one that does not open, or holds anything but application data: a
        KeyUpdate, a session ticket). None while the layer is anywhere but its plain state:
        decrypting both directions in order, nothing held, lost or half read but a record."""
        if (self.state != DECRYPTING or self.stopped[0] or self.stopped[1] or self.lost[0] or self.lost[1]
                or not (self.encrypted[0] and self.encrypted[1]) or self._held or self.replay):
            return None
        for d in (0, 1):
            reader = self.readers[d]
            if reader.hunting or reader.dead:
                return None
            if self.version == TLS13 and (not self.application[d] or self.handshakes[d].buf or self.handshakes[d].skip):
                return None
        return self._opener(self._protection[0]), self._opener(self._protection[1])

    @staticmethod
    def _opener(protection):
        open_record = protection.open

        def open_application_data(fragment: bytes) -> bytes | None:
            try:
                inner, plain = open_record(APPLICATION_DATA, TLS12, fragment)
            except Undecryptable:
                return None  # the sequence number moves on only when a record opens
            if inner != APPLICATION_DATA:
                protection.seq -= 1  # the layer opens it again, and reads what it holds
                return None
            return plain
        return open_application_data

    # -- state as data (flow_state.py) --------------------------------------------------------------

    def snapshot(self) -> dict:
        """The layer as plain data: no secret and nothing derived from one (the keys are derived
        again from the key log at restore). Only the live agent holds records for a key, and it
        does not save flows: a layer still waiting is saved as not decrypted."""
        state, note = (NOT_DECRYPTED, NO_KEY) if self.state == WAITING else (self.state, self.note)
        return {
            "version": self.version, "cipher_suite": self.suite, "sni": self.sni,
            "client_random": self.client_random.hex() if self.client_random is not None else None,
            "server_random": self.server_random.hex() if self.server_random is not None else None,
            "encrypt_then_mac": self.encrypt_then_mac, "state": state, "note": note,
            "failures": self.failures, "records": self.records,
            "directions": [{
                "encrypted": self.encrypted[d], "application": self.application[d],
                "generation": self.generation[d], "stopped": self.stopped[d], "lost": self.lost[d],
                "seq": self._protection[d].seq if state == DECRYPTING and self._protection[d] is not None else 0,
                "record_bytes": encode_bytes(self.readers[d].buf), "hunting": self.readers[d].hunting,
                "dead": self.readers[d].dead, "handshake_bytes": encode_bytes(self.handshakes[d].buf),
                "handshake_skip": self.handshakes[d].skip,
            } for d in (0, 1)],
        }

    @classmethod
    def restore(cls, doc, keylog: KeyLog | None, where: str = "connection.tls") -> "TlsLayer":
        """The layer `snapshot()` described, its keys derived again from `keylog` (a missing key
        makes the connection not decrypted, as in a single file). Raises flow_state.FlowStateError
        naming the first field that fails a check."""
        f = Fields(doc, where)
        layer = cls(keylog)
        layer.version = f.int("version", 0, 0xFFFF, optional=True)
        layer.suite = f.int("cipher_suite", 0, 0xFFFF, optional=True)
        layer.sni = f.str("sni", max_len=255, optional=True)
        for name in ("client_random", "server_random"):
            text = f.str(name, max_len=64, optional=True)
            if text is not None:
                try:
                    value = bytes.fromhex(text)
                except ValueError:
                    value = b""
                if len(value) != 32:
                    f.fail(name, "not 32 bytes in hex")
                setattr(layer, name, value)
        layer.encrypt_then_mac = f.bool("encrypt_then_mac")
        layer.state = f.str("state", choices=(HANDSHAKE_STATE, DECRYPTING, NOT_DECRYPTED))
        layer.note = f.str("note", max_len=200, optional=True)
        layer.failures, layer.records = f.int("failures"), f.int("records")
        seqs = []
        for d, item in enumerate(f.list("directions", 2, length=2)):
            g = Fields(item, f"{where}.directions[{d}]")
            layer.encrypted[d], layer.application[d] = g.bool("encrypted"), g.bool("application")
            layer.generation[d], layer.stopped[d] = g.int("generation", 0, 1 << 32), g.bool("stopped")
            layer.lost[d] = g.int("lost")
            seqs.append(g.int("seq", 0, (1 << 64) - 1))
            reader, handshake = layer.readers[d], layer.handshakes[d]
            reader.buf = g.bytes("record_bytes", HEADER + MAX_RECORD + HEADER)
            reader.hunting, reader.dead = g.bool("hunting"), g.bool("dead")
            handshake.buf = g.bytes("handshake_bytes", MAX_MESSAGE + 4)
            handshake.skip = g.int("handshake_skip", 0, 1 << 24)
        if layer.state != HANDSHAKE_STATE and None in (layer.version, layer.suite, layer.client_random, layer.server_random):
            f.fail("state", f"{layer.state} without the hellos")
        if layer.state == DECRYPTING:
            if SUITES.get(layer.suite) is None or layer.version not in (TLS12, TLS13):
                f.fail("cipher_suite", "not one that is decrypted")
            if keylog is None or not layer._install_keys():
                layer._give_up(NO_KEY_LOG if keylog is None else NO_KEY)
            else:
                for d in (0, 1):
                    layer._protection[d].seq = seqs[d]
        return layer
