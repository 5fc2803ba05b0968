import os
import shutil
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "..", "shared", "corpus", "public")

# `make test` runs the suite in two pytest-xdist workers (--dist loadgroup), each module a unit of
# work so its module fixtures are built once. Two units are wider than a module: every test marked
# `rabbitmq` drives the one broker or captures its loopback traffic, so they all run in one worker,
# in turn, and no capture sees another test's traffic; and the modules that read the
# `analysed_examples` lake share a worker so that lake is analysed once. The longest units go first
# (measured 2026-12-02, of a 940 s serial run: broker 210 s, test_incremental 197 s, the examples'
# lake 120 s; the standalone cluster's module, added later, took 832 s on a machine under load
# 12-35 from other work), so that no worker is left running one of them alone at the end.
BROKER = "broker"
EXAMPLES_LAKE = "examples-lake"
LONGEST_FIRST = (BROKER, "test_spark_cluster", "test_incremental", EXAMPLES_LAKE)


def work_units(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    on_examples_lake = {item.module for item in items if "analysed_examples" in getattr(item, "fixturenames", ())}
    return {item: BROKER if item.get_closest_marker("rabbitmq")
            else EXAMPLES_LAKE if item.module in on_examples_lake
            else item.module.__name__.rsplit(".", 1)[-1] for item in items}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    _skip_unbuilt_twins(items)
    units = work_units(items)
    for item, unit in units.items():
        item.add_marker(pytest.mark.xdist_group(unit))
    rank = {unit: place for place, unit in enumerate(LONGEST_FIRST)}
    # A stable sort: each module's tests stay together and in order.
    items.sort(key=lambda item: rank.get(units[item], len(rank)))


# Under xdist, what each worker ran: {worker: {unit: seconds}} and when it reported its last test,
# printed at the end (`make test`) so that a unit which leaves the other worker idle is seen.
_WORKERS: dict[str, dict[str, float]] = {}
_LAST_REPORT: dict[str, float] = {}


def pytest_runtest_logreport(report):
    gateway = getattr(getattr(report, "node", None), "gateway", None)
    if gateway is None or "@" not in report.nodeid:
        return
    unit = report.nodeid.rsplit("@", 1)[1]
    units = _WORKERS.setdefault(gateway.id, {})
    units[unit] = units.get(unit, 0.0) + report.duration
    _LAST_REPORT[gateway.id] = time.monotonic()


def pytest_terminal_summary(terminalreporter):
    # Only node ids of --dist loadgroup end in their unit; elsewhere an "@" is a parameter's own.
    if not _WORKERS or terminalreporter.config.getoption("dist", None) != "loadgroup":
        return
    ended = max(_LAST_REPORT.values())
    terminalreporter.section("work units by worker (seconds)")
    for worker, units in sorted(_WORKERS.items()):
        longest = sorted(units.items(), key=lambda unit: -unit[1])[:8]
        terminalreporter.write_line(
            f"{worker}: {sum(units.values()):.0f} s in {len(units)} units, idle for the last "
            f"{ended - _LAST_REPORT[worker]:.0f} s; longest: " + ", ".join(f"{u} {t:.0f}" for u, t in longest))


def pytest_collection_finish(session):
    """In an xdist worker under --dist loadgroup, every test must carry its unit in its node id: with
    pytest 9.2, xdist 3.8's suffix was dropped and every test was a unit of its own (module fixtures
    built in both workers, broker tests side by side), without a word."""
    if getattr(session.config.option, "loadgroup", False):
        ungrouped = [item.nodeid for item in session.items if "@" not in item.nodeid]
        if ungrouped:
            raise pytest.UsageError(f"--dist loadgroup: {len(ungrouped)} test(s) without their work unit, "
                                    f"such as {ungrouped[0]}: this pytest and pytest-xdist do not group")


def check_built(available: bool, missing: str) -> None:
    """A C module's own test: under CI=true it must be built (a machine where it does not compile
    fails loudly instead of testing the Python path twice); elsewhere a missing one skips."""
    if not available:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(missing + ": CI=true requires it")
        pytest.skip(missing)


def needs_built(available: bool, missing: str):
    """Marks tests of a C module against its Python path (`c_twin`): they skip where it is not built,
    unless in CI (where they then fail on it); the suite's pure-Python run (`make test`'s second,
    ACKSCOPE_PURE_PYTHON=1, where no twin runs) leaves them out with `-m "not c_twin"`."""
    return pytest.mark.c_twin(available=available, reason=missing)


def _skip_unbuilt_twins(items: list[pytest.Item]) -> None:
    for item in items:
        twin = item.get_closest_marker("c_twin")
        if twin is not None and not twin.kwargs.get("available", True) and not os.environ.get("CI"):
            item.add_marker(pytest.mark.skip(reason=twin.kwargs["reason"]))


@pytest.fixture(scope="session")
def corpus_dir() -> str:
    if not os.path.isdir(CORPUS):
        pytest.fail(f"the public corpus is missing: expected {CORPUS} (../shared beside the project)")
    return CORPUS


@pytest.fixture(scope="session")
def dumpcap() -> str:
    path = shutil.which("dumpcap")
    if path is None:
        pytest.fail("dumpcap is not installed: run `make test` (deploy/ci/services.sh installs it)")
    return path


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the whole run: starting a JVM costs seconds. It runs every Spark
    test, hundreds of jobs: the 2 GB driver the analysis is sized for, not Spark's 1 GB default."""
    from spark_jobs.session import get_spark
    session = get_spark("local[2]", "ackscope-tests", driver_memory="2g")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def analysed_examples(spark, tmp_path_factory):
    """Every recorded example ingested into one lake and analysed once, at the lab's thresholds:
    (lake folder, the run's report). Read it, never write to it: several test modules share it
    (an analysis run has a fixed cost of a minute or more)."""
    import glob

    from analyzer.ingest import ingest_file
    from spark_jobs.analyze import analyze

    from .findings_check import LAB_THRESHOLDS

    lake_dir = str(tmp_path_factory.mktemp("analysed-examples"))
    for capture in sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng"))):
        assert not ingest_file(capture, lake_dir).errors, capture
    return lake_dir, analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
