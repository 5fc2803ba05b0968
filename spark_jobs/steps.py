"""A run's steps: how long each took and how many Spark jobs it started, with one progress line
per step for whoever watches (stderr), while Spark's own log goes to its file (session.py)."""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from typing import TextIO

from pyspark.sql import SparkSession

from analyzer.terminal import LINE_LIMIT, printable


class Steps:
    """`spark`: None for a run that starts no Spark (its steps start no Spark job)."""

    def __init__(self, spark: SparkSession | None, progress: TextIO | None = None):
        self.context, self.progress = None, progress
        # Every job of this run carries the group, so the status tracker can count them.
        self.group = f"ackscope-{uuid.uuid4().hex[:12]}"
        if spark is not None:
            self.context = spark.sparkContext
            self.context.setJobGroup(self.group, "ackscope analyze")
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str):
        jobs_before, started = self.spark_jobs(), time.monotonic()
        yield
        self.took(name, time.monotonic() - started, self.spark_jobs() - jobs_before)

    def took(self, name: str, seconds: float, spark_jobs: int = 0, detail: str = "") -> None:
        """A step timed by its caller (one known to have taken place only once it is over)."""
        self.seconds[name] = round(self.seconds.get(name, 0.0) + seconds, 2)
        if self.progress is not None:
            said = f": {printable(detail, LINE_LIMIT)}" if detail else ""  # may quote an error, paths and all
            print(f"ackscope analyze: {name} ({seconds:.1f}s, {spark_jobs} Spark jobs){said}", file=self.progress,
                  flush=True)

    def spark_jobs(self) -> int:
        return 0 if self.context is None else len(self.context.statusTracker().getJobIdsForGroup(self.group))
