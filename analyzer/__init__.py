"""The capture side of ackscope: the sans-IO decoder core and the per-channel state machine."""

import os


def pure_python() -> bool:
    """ACKSCOPE_PURE_PYTHON set to anything but "" or "0": the C modules' paths (the decode lane,
    the pass's Arrow conversions, the record maker) are off and their Python references do all."""
    return os.environ.get("ACKSCOPE_PURE_PYTHON", "") not in ("", "0")
