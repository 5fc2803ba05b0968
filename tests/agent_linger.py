"""`ackscope capture` with a shorter linger for ended connections, for tests/test_agent_churn.py:
`python -m tests.agent_linger SECONDS <capture flags>`.

The agent's own code runs unchanged; only decoder.LINGER_S (read at each take) is set: the churn
test needs connections forgotten while others' rows wait, many times over, and at the agent's 30 s
that took 75 s of traffic. On loopback an ended flow's stragglers come within milliseconds, so a
few seconds of linger still keep them from opening a phantom flow (which the test would see as a
second connection row).
"""

import sys

from analyzer import cli
from analyzer.agent import decoder

if __name__ == "__main__":
    decoder.LINGER_S = float(sys.argv[1])
    sys.exit(cli.main(["capture", *sys.argv[2:]]))
