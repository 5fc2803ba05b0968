"""The two ways a lab run fails, named for whose fault they are."""


class LabError(Exception):
    """The lab cannot run: broker or dumpcap missing, a tool failed, a capture is unreadable."""


class NotObserved(Exception):
    """The traffic ran but the capture does not show what the scenario is about (or shows
    something it must not). Timing on a busy machine can cause it, so the runner retries."""
