"""A capture file's fingerprint: the SHA-256 of its bytes, the Delta app transaction id of its commits.

Light on imports on purpose: the `ingest` command starts hashing its files on a thread before it
imports the decoder (pyarrow, numpy, delta-rs: ~0.2 s). SHA-256 runs without the GIL, so the
hashing overlaps those imports instead of following them.
"""

import concurrent.futures
import hashlib


def fingerprint(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Fingerprints:
    """Fingerprints of files, computed one after the other on a thread from the moment this is made.
    Calling it with a path waits for that file's, and raises OSError as `fingerprint` would."""

    def __init__(self, paths: list[str]):
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ackscope-sha256")
        self._futures = {path: self._thread.submit(fingerprint, path) for path in dict.fromkeys(paths)}
        self._thread.shutdown(wait=False)  # runs what was submitted, then ends

    def __call__(self, path: str) -> str:
        future = self._futures.get(path)
        return future.result() if future is not None else fingerprint(path)
