import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "..", "shared", "corpus", "public")


def check_built(available: bool, missing: str) -> None:
    """A C module's own test: under CI=true it must be built (a machine where it does not compile
    fails loudly instead of testing the Python path twice); elsewhere a missing one skips."""
    if not available:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(missing + ": CI=true requires it")
        pytest.skip(missing)


def needs_built(available: bool, missing: str):
    """Marks tests of a C module against its Python path: they skip where it is not built, unless
    in CI (where they then fail on it)."""
    return pytest.mark.skipif(not available and not os.environ.get("CI"), reason=missing)


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
