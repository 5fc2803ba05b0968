"""Start-up without pandas, for processes that only ingest.

The first time pyarrow converts a Python sequence it asks whether pandas is installed (to recognise
pandas objects among its inputs), and asking means importing pandas: ~0.2 s, half of what an
`ackscope ingest` spends starting up. The decoder hands pyarrow lists and tuples of its own, never
pandas objects, so it lets pyarrow ask while pandas is hidden. pyarrow keeps that answer for
recognising inputs only; whatever really needs pandas (`to_pandas`, `from_pandas`) still imports it
(pyarrow tries again there). A process that passes pandas objects to `pa.array` must not call this:
hence only the `ingest` command and its workers do, and only before anything else imported pandas.
"""

import sys


class _HidePandas:
    """A meta path finder that makes `import pandas` fail. (Putting None in sys.modules is not
    enough: pyarrow's compiled import returns the None instead of raising.)"""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden while pyarrow probes for it)", name=name)
        return None


def answer_pandas_probe_without_pandas() -> None:
    if "pandas" in sys.modules:
        return  # already imported: pyarrow finds it at no cost
    import pyarrow as pa

    finder = _HidePandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])  # the first conversion of a Python sequence: pyarrow probes for pandas here
    finally:
        sys.meta_path.remove(finder)
