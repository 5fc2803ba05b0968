"""Key schedules and record protection, on the `cryptography` library (no hand-written ciphers).

TLS 1.2: the key block from the master secret with the PRF (RFC 5246 5, 6.3); AES-GCM (RFC 5288),
ChaCha20-Poly1305 (RFC 7905) and AES-CBC with HMAC, MAC-then-encrypt or encrypt-then-MAC
(RFC 7366). TLS 1.3: traffic keys from the logged traffic secrets with HKDF-Expand-Label, and
the next generation of a secret after a KeyUpdate (RFC 8446 7.1-7.3, 5.2-5.3).

Secrets live in these objects only: they have no repr that shows them, and nothing here logs.
"""

import hashlib
import hmac
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

GCM, CHACHA, CBC = "gcm", "chacha20-poly1305", "cbc"
_HEADER = struct.Struct("!BHH")  # a record header: content type, version, length


@dataclass(frozen=True, slots=True)
class Suite:
    name: str
    cipher: str
    key_len: int
    hash: str             # the PRF / HKDF hash
    mac: str | None = None  # CBC suites: the HMAC hash


def _suites() -> dict[int, Suite]:
    table = {
        0x1301: Suite("TLS_AES_128_GCM_SHA256", GCM, 16, "sha256"),
        0x1302: Suite("TLS_AES_256_GCM_SHA384", GCM, 32, "sha384"),
        0x1303: Suite("TLS_CHACHA20_POLY1305_SHA256", CHACHA, 32, "sha256"),
    }
    for kx, gcm128, gcm256, chacha, cbc in (
            ("ECDHE_RSA", 0xC02F, 0xC030, 0xCCA8, (0xC013, 0xC014, 0xC027, 0xC028)),
            ("ECDHE_ECDSA", 0xC02B, 0xC02C, 0xCCA9, (0xC009, 0xC00A, 0xC023, 0xC024)),
            ("DHE_RSA", 0x009E, 0x009F, 0xCCAA, (0x0033, 0x0039, 0x0067, 0x006B)),
            ("RSA", 0x009C, 0x009D, None, (0x002F, 0x0035, 0x003C, 0x003D))):
        table[gcm128] = Suite(f"TLS_{kx}_WITH_AES_128_GCM_SHA256", GCM, 16, "sha256")
        table[gcm256] = Suite(f"TLS_{kx}_WITH_AES_256_GCM_SHA384", GCM, 32, "sha384")
        if chacha is not None:
            table[chacha] = Suite(f"TLS_{kx}_WITH_CHACHA20_POLY1305_SHA256", CHACHA, 32, "sha256")
        sha1_128, sha1_256, sha256_128, sha384_256 = cbc
        table[sha1_128] = Suite(f"TLS_{kx}_WITH_AES_128_CBC_SHA", CBC, 16, "sha256", "sha1")
        table[sha1_256] = Suite(f"TLS_{kx}_WITH_AES_256_CBC_SHA", CBC, 32, "sha256", "sha1")
        # RFC 5289: the _SHA384 CBC suites use SHA-384 for the PRF too.
        table[sha256_128] = Suite(f"TLS_{kx}_WITH_AES_128_CBC_SHA256", CBC, 16, "sha256", "sha256")
        table[sha384_256] = Suite(f"TLS_{kx}_WITH_AES_256_CBC_SHA384" if kx.startswith("ECDHE")
                                  else f"TLS_{kx}_WITH_AES_256_CBC_SHA256", CBC, 32,
                                  "sha384" if kx.startswith("ECDHE") else "sha256",
                                  "sha384" if kx.startswith("ECDHE") else "sha256")
    return table


SUITES = _suites()


def suite_name(suite: int) -> str:
    known = SUITES.get(suite)
    return known.name if known else f"0x{suite:04X}"


class Undecryptable(ValueError):
    """A record that does not open with these keys (wrong keys, wrong sequence number, damage)."""


# -- key schedules ---------------------------------------------------------------------------------

def _p_hash(digest: str, secret: bytes, seed: bytes, length: int) -> bytes:
    out, a = b"", seed
    while len(out) < length:
        a = hmac.digest(secret, a, digest)
        out += hmac.digest(secret, a + seed, digest)
    return out[:length]


def tls12_protections(suite: Suite, master: bytes, client_random: bytes, server_random: bytes,
                      encrypt_then_mac: bool) -> tuple["Protection", "Protection"]:
    """(client's, server's) record protection from a TLS 1.2 master secret."""
    mac_len = hashlib.new(suite.mac).digest_size if suite.cipher == CBC else 0
    iv_len = {GCM: 4, CHACHA: 12, CBC: 0}[suite.cipher]
    block = _p_hash(suite.hash, master, b"key expansion" + server_random + client_random,
                    2 * (mac_len + suite.key_len + iv_len))
    parts, pos = [], 0
    for n in (mac_len, mac_len, suite.key_len, suite.key_len, iv_len, iv_len):
        parts.append(block[pos:pos + n])
        pos += n
    client_mac, server_mac, client_key, server_key, client_iv, server_iv = parts
    return (Protection(suite, client_key, client_iv, False, client_mac, encrypt_then_mac),
            Protection(suite, server_key, server_iv, False, server_mac, encrypt_then_mac))


def hkdf_expand_label(digest: str, secret: bytes, label: str, length: int, context: bytes = b"") -> bytes:
    full = b"tls13 " + label.encode()
    info = length.to_bytes(2, "big") + bytes((len(full),)) + full + bytes((len(context),)) + context
    return HKDFExpand(getattr(hashes, digest.upper())(), length, info).derive(secret)


def tls13_protection(suite: Suite, secret: bytes) -> "Protection":
    return Protection(suite, hkdf_expand_label(suite.hash, secret, "key", suite.key_len),
                      hkdf_expand_label(suite.hash, secret, "iv", 12), True)


def next_traffic_secret(suite: Suite, secret: bytes) -> bytes:
    """The sender's secret after a KeyUpdate (RFC 8446 7.2)."""
    return hkdf_expand_label(suite.hash, secret, "traffic upd", hashlib.new(suite.hash).digest_size)


# -- record protection -----------------------------------------------------------------------------

class Protection:
    """One direction's keys: opens its records in order (`seq` counts them)."""
    __slots__ = ("suite", "tls13", "seq", "_aead", "_key", "_iv", "_iv_int", "_mac_key", "_mac_len", "_etm")

    def __init__(self, suite: Suite, key: bytes, iv: bytes, tls13: bool, mac_key: bytes = b"",
                 encrypt_then_mac: bool = False):
        self.suite, self.tls13, self.seq = suite, tls13, 0
        self._key, self._iv, self._mac_key, self._etm = key, iv, mac_key, encrypt_then_mac
        self._iv_int = int.from_bytes(iv, "big")
        self._mac_len = len(mac_key)
        self._aead = AESGCM(key) if suite.cipher == GCM else ChaCha20Poly1305(key) if suite.cipher == CHACHA else None

    def __repr__(self) -> str:  # never the keys
        return f"Protection({self.suite.name}, seq={self.seq})"

    def open(self, ctype: int, version: int, fragment: bytes, seq: int | None = None) -> tuple[int, bytes]:
        """(content type, plaintext) of one record at sequence number `seq` (default: the next);
        the sequence number moves on only when it opens."""
        seq = self.seq if seq is None else seq
        try:
            if self.tls13:
                out = self._open13(ctype, version, fragment, seq)
            elif self._aead is None:
                out = ctype, self._open_cbc(ctype, version, fragment, seq)
            else:
                out = ctype, self._open12_aead(ctype, version, fragment, seq)
        except InvalidTag:
            raise Undecryptable("authentication failed") from None
        self.seq = seq + 1
        return out

    def _nonce(self, seq: int) -> bytes:
        return (self._iv_int ^ seq).to_bytes(12, "big")

    def _open13(self, ctype: int, version: int, fragment: bytes, seq: int) -> tuple[int, bytes]:
        if len(fragment) < 17:
            raise Undecryptable("record too short")
        header = _HEADER.pack(ctype, version, len(fragment))
        inner = self._aead.decrypt((self._iv_int ^ seq).to_bytes(12, "big"), fragment, header)
        if inner and inner[-1]:  # the usual record: no padding after the content type
            return inner[-1], inner[:-1]
        end = len(inner.rstrip(b"\x00"))
        if not end:
            raise Undecryptable("no content type in the record")
        return inner[end - 1], inner[:end - 1]

    def _open12_aead(self, ctype: int, version: int, fragment: bytes, seq: int) -> bytes:
        if self.suite.cipher == GCM:
            if len(fragment) < 24:
                raise Undecryptable("record too short")
            nonce, fragment = self._iv + fragment[:8], fragment[8:]
        else:
            if len(fragment) < 16:
                raise Undecryptable("record too short")
            nonce = self._nonce(seq)
        aad = seq.to_bytes(8, "big") + bytes((ctype, version >> 8, version & 0xFF)) + (len(fragment) - 16).to_bytes(2, "big")
        return self._aead.decrypt(nonce, fragment, aad)

    def _mac(self, seq: int, ctype: int, version: int, data: bytes) -> bytes:
        head = seq.to_bytes(8, "big") + bytes((ctype, version >> 8, version & 0xFF)) + len(data).to_bytes(2, "big")
        return hmac.digest(self._mac_key, head + data, self.suite.mac)

    def _open_cbc(self, ctype: int, version: int, fragment: bytes, seq: int) -> bytes:
        mac_len = self._mac_len
        if self._etm:
            body, tag = fragment[:-mac_len], fragment[-mac_len:]
            if len(body) < 32 or len(body) % 16 or not hmac.compare_digest(tag, self._mac(seq, ctype, version, body)):
                raise Undecryptable("record MAC does not match")
            plain = self._cbc_decrypt(body)
            pad = plain[-1]
            if pad + 1 > len(plain):
                raise Undecryptable("bad padding")
            return plain[:-(pad + 1)]
        if len(fragment) < 16 + max(16, mac_len + 1) or len(fragment) % 16:
            raise Undecryptable("record length is not whole cipher blocks")
        plain = self._cbc_decrypt(fragment)
        pad = plain[-1]
        end = len(plain) - pad - 1 - mac_len
        if end < 0 or plain[end + mac_len:-1] != bytes((pad,)) * pad:
            raise Undecryptable("bad padding")
        content, tag = plain[:end], plain[end:end + mac_len]
        if not hmac.compare_digest(tag, self._mac(seq, ctype, version, content)):
            raise Undecryptable("record MAC does not match")
        return content

    def _cbc_decrypt(self, body: bytes) -> bytes:
        decryptor = Cipher(algorithms.AES(self._key), modes.CBC(body[:16])).decryptor()
        return decryptor.update(body[16:]) + decryptor.finalize()
