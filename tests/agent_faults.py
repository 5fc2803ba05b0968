"""`ackscope capture` with a fault planted from outside the product, for
tests/test_agent_internal_error.py: `python -m tests.agent_faults <capture flags>`.

The agent's own code runs unchanged, with two of its parts replaced by subclasses here:
- a row sink that loses the constants of every connection but the first, as the bug of issue 62
  did (a row waiting for its body held a position that was renumbered): the real RowSink.take then
  meets rows it cannot place, the internal error under test;
- a lake whose final flush (the main thread's, after the loop stopped) takes two seconds, as a slow
  store does, so the test can read /readyz while the failing agent is still up.
"""

import sys
import threading
import time

from analyzer import cli, rows
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


if __name__ == "__main__":
    decoder.RowSink = ForgetfulRowSink
    run.LakeSink = SlowFinalFlushSink
    sys.exit(cli.main(["capture", *sys.argv[1:]]))
