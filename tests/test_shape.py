"""Issue 58's limits on the project's shape, kept: the analysis (spark_jobs/) in at most 3,000
lines, every line counted (code, docstrings, comments, blank), and the README read in five
minutes, at most 1,500 words (as `wc -w` counts them). Mechanics belong in docs/."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_analysis_is_at_most_3000_lines():
    files = sorted((ROOT / "spark_jobs").rglob("*.py"))
    lines = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines()) for path in files}
    assert "spark_jobs/analyze.py" in lines and lines["spark_jobs/analyze.py"] > 0
    assert sum(lines.values()) <= 3000, sorted(lines.items(), key=lambda item: -item[1])


def test_the_readme_is_at_most_1500_words():
    words = len((ROOT / "README.md").read_text().split())
    assert 0 < words <= 1500, words
