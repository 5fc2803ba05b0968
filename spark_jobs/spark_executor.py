"""Spark's executor: the pass (connection_pass.py) on `local[N]` or any cluster; it gives what the
local executor's gives (local_executor.py).
"""

from __future__ import annotations

from functools import cached_property

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.connection_analysis import ANALYSIS_COLUMNS, Settings

from .connection_pass import STATE_TABLE, PassSummary, connection_pass, summarised_pass
from .delta_io import read_delta, read_files
from .run_scope import RunScope
from .session import delta_mode as resolve_delta_mode, use_lake
from .timeline.plans import first_day, of_connections


class SparkExecutor:
    """The pass of one run on this session, over the run's snapshot of `frames`."""

    def __init__(self, spark: SparkSession, lake: str, plan: RunScope, settings: Settings, delta_mode: str):
        use_lake(spark, lake)  # a lake Spark cannot reach fails here, before any step
        self.spark, self.lake, self.plan, self.settings = spark, lake, plan, settings
        self.delta_mode = resolve_delta_mode(spark, delta_mode)   # how Spark reaches the tables

    @cached_property
    def connections(self) -> DataFrame:
        return read_delta(self.spark, self.lake, "connections", schema.CONNECTIONS, self.delta_mode)

    def connection_pass(self, keys: list[str] | None, carried: bool = False) -> PassSummary:
        """These connections (None: all) analysed from all their frames: from the first day any of them
        was seen (the connections table says; one Spark job), else from the start. Or (`carried`)
        carried on from their checkpoints over the plan's new files; the connections planned whole
        (`RunScope.whole`) are then not read."""
        connections, states = self.connections, None
        if keys is not None:
            connections = of_connections(connections, keys)
        if carried:
            frames = read_files(self.spark, self.lake, "frames", self.plan.new_files, list(ANALYSIS_COLUMNS))
            if self.plan.whole:
                frames = of_connections(frames, keys)
            states = of_connections(read_delta(self.spark, self.lake, STATE_TABLE, schema.ANALYSIS_STATE,
                                               self.delta_mode), keys)
        elif keys is None:
            frames = self._frames_since(None)
        else:
            seen = connections.agg(F.countDistinct("connection_id").alias("known"),
                                   F.min("first_ts_ns").alias("first_ns")).first()
            frames = of_connections(self._frames_since(first_day(seen, keys)), keys)
        return summarised_pass(connection_pass(frames, connections, self.settings, self.plan.frames_version,
                                               write_to=self.lake, states=states), carried)

    def _frames_since(self, day: str | None) -> DataFrame:
        """The run's snapshot of `frames` from this UTC day on (None: all of it)."""
        return read_delta(self.spark, self.lake, "frames", schema.FRAMES, self.delta_mode, since=day,
                          version=self.plan.frames_version)
