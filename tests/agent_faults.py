"""`ackscope capture` with a fault planted from outside the product, for
tests/test_agent_internal_error.py: `python -m tests.agent_faults FAULT <capture flags>`.

The agent's own code runs unchanged, with some of its parts replaced by subclasses here. FAULT is
- `unplaced-row`: a row sink that loses the constants of every connection but the first, as the
  bug of issue 62 did (a row waiting for its body held a position that was renumbered): the real
  RowSink.take then meets rows it cannot place, the internal error under test; and a lake whose
  final flush (the main thread's, after the loop stopped) takes two seconds, as a slow store does,
  so the test can read /readyz while the failing agent is still up;
- `lake-panic`: delta-rs panics once, just after the sink thread's first commit to the frames
  table landed: pyo3 raises a Rust panic as `PanicException`, a BaseException, and the sink meets
  a commit whose call failed but whose rows are in the table.
"""

import sys
import threading
import time

from analyzer import cli, lake, rows
from analyzer.agent import decoder, run, sink

FINAL_FLUSH_DELAY_S = 2.0


class ForgetfulRowSink(rows.RowSink):
    def add_connection(self, constants: tuple) -> int:
        key = super().add_connection(constants)
        if key > 0:
            self.forget_connection(key)
        return key


class SlowFinalFlushSink(sink.LakeSink):
    def flush(self, metadata=None) -> bool:
        if threading.current_thread() is threading.main_thread():
            time.sleep(FINAL_FLUSH_DELAY_S)
        return super().flush(metadata)


class PanicException(BaseException):
    """As pyo3 names the exception a Rust panic becomes; like it, not an Exception."""


class PanicAfterCommitWriter(lake.TableWriter):
    panicked = False

    def commit(self, *args, **kwargs) -> int:
        version = super().commit(*args, **kwargs)
        if self.path.endswith("frames") and threading.current_thread().name == "ackscope-sink" \
                and not PanicAfterCommitWriter.panicked:
            PanicAfterCommitWriter.panicked = True
            raise PanicException("planted: a panic in delta-rs after the commit landed")
        return version


def unplaced_row() -> None:
    decoder.RowSink = ForgetfulRowSink
    run.LakeSink = SlowFinalFlushSink


def lake_panic() -> None:
    lake.TableWriter = PanicAfterCommitWriter


FAULTS = {"unplaced-row": unplaced_row, "lake-panic": lake_panic}

if __name__ == "__main__":
    FAULTS[sys.argv[1]]()
    sys.exit(cli.main(["capture", *sys.argv[2:]]))
