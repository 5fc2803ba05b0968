"""The local driver JVM's garbage collector (session.LOCAL_GC): the throughput collector, unless
the options choose one."""

from spark_jobs.session import LOCAL_GC, local_gc


def test_the_local_driver_runs_the_throughput_collector(spark):
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    assert {bean.getName() for bean in beans} == {"PS Scavenge", "PS MarkSweep"}


def test_a_collector_the_options_choose_is_kept():
    assert local_gc(["-Dlog4j2.configurationFile=file:///x", ""]) == [LOCAL_GC]
    assert local_gc(["-Xlog:gc -XX:+UseG1GC"]) == []
    assert local_gc(["-XX:+UseZGC"]) == []
    assert local_gc(["-XX:+UseGCOverheadLimit"]) == [LOCAL_GC]  # a collector's option, not a collector
