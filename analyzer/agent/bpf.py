"""Interface lookup and BPF compilation with scapy (libpcap underneath), in a short-lived child
process: `python -m analyzer.agent.bpf IFACE DLT EXPRESSION` prints the compiled instructions.

Why a child: scapy is needed once, at start-up, and importing it costs the long-running agent
~20 MB of resident memory it would keep for its whole life (its memory budget is 300 MB at
10,000 connections, bench/capture.py)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

INSTRUCTION_BYTES = 8  # struct sock_filter / bpf_insn: u16 code, u8 jt, u8 jf, u32 k
BPF_RET_K = 0x06
_INSTRUCTION = struct.Struct("=HBBI")


class BpfError(Exception):
    pass


def compile_in_child(iface: str, dlt: int, expression: str, snap_bytes: int) -> bytes:
    """The filter's instructions, as the kernel's SO_ATTACH_FILTER takes them."""
    result = subprocess.run([sys.executable, "-m", "analyzer.agent.bpf", iface, str(dlt), expression],
                            capture_output=True, text=True, timeout=120)
    try:
        answer = json.loads(result.stdout)
    except ValueError:
        raise BpfError(f"compiling the capture filter failed: {result.stderr.strip()[-500:]}") from None
    if "error" in answer:
        raise BpfError(answer["error"])
    return with_snap_length(bytes.fromhex(answer["instructions"]), snap_bytes)


def with_snap_length(instructions: bytes, snap_bytes: int) -> bytes:
    """A socket filter's accepting `ret` is how many bytes of the packet the socket gets. scapy compiles
    with a snap length of 65535, but loopback carries 65535-byte IP packets plus their 14-byte
    Ethernet header (and GSO larger ones): measured, the last 14 bytes of full-size segments were cut
    (a "truncated" capture gap). Accepting returns get the agent's own snap length."""
    out = bytearray(instructions)
    for offset in range(0, len(out), INSTRUCTION_BYTES):
        code, jt, jf, k = _INSTRUCTION.unpack_from(out, offset)
        if code == BPF_RET_K and k:
            _INSTRUCTION.pack_into(out, offset, code, jt, jf, snap_bytes)
    return bytes(out)


def _compile_here(iface: str, dlt: int, expression: str) -> dict:
    import ctypes

    import scapy.arch  # noqa: F401  (loads the Linux interface provider)
    from scapy.arch.common import compile_filter
    from scapy.interfaces import resolve_iface
    if iface != "any":
        try:
            resolve_iface(iface)
        except Exception:
            return {"error": f"no such network interface: {iface}"}
    try:
        program = compile_filter(expression, linktype=dlt)
    except Exception as exc:
        return {"error": f"cannot compile the capture filter {expression!r}: {exc}"}
    return {"instructions": ctypes.string_at(program.bf_insns, program.bf_len * INSTRUCTION_BYTES).hex()}


if __name__ == "__main__":
    print(json.dumps(_compile_here(sys.argv[1], int(sys.argv[2]), sys.argv[3])))
