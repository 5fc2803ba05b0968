"""The C modules are the only thing setup.py adds to pyproject.toml: the native decode lane
(analyzer/_lane.c), the connection pass's Arrow conversions (analyzer/_columns.c), the
records' maker (analyzer/timeline/_records.c), the machine's plain frames
(analyzer/timeline/_plain.c), the per-record folds of channel_metrics, unacked_buildup and
the publish detectors (analyzer/_folds.c; it and _plain.c share analyzer/_slots.h, _plain.c and _records.c share
analyzer/_untrack.h, _columns.c and _plain.c share analyzer/_row.h) and unacked_buildup's profile fold (analyzer/detectors/_profile.c). All are
optional: where they do not compile, the Python paths do the work (analyzer/native.py,
analyzer/columns.py, records.py's class call, connection.py's `python_feed`, metrics.py's
`python_record`, consumer.py's `python_add`, detectors' `python_publish`, profile.py's
`python_fold`), and tests/test_native_lane.py, test_columns.py, test_records.py, test_plain.py,
test_folds.py and test_detector_folds.py fail under CI=true so that this never goes unnoticed there."""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
         "-Wno-cast-function-type"]

setup(ext_modules=[Extension("analyzer._lane", ["analyzer/_lane.c"], optional=True, extra_compile_args=FLAGS),
                   Extension("analyzer._columns", ["analyzer/_columns.c"], optional=True, depends=["analyzer/_row.h"],
                             extra_compile_args=FLAGS),
                   Extension("analyzer.timeline._records", ["analyzer/timeline/_records.c"], optional=True,
                             include_dirs=["analyzer"], depends=["analyzer/_untrack.h"], extra_compile_args=FLAGS),
                   Extension("analyzer.timeline._plain", ["analyzer/timeline/_plain.c"], optional=True,
                             include_dirs=["analyzer"], depends=["analyzer/_slots.h", "analyzer/_untrack.h",
                                                                  "analyzer/_row.h"], extra_compile_args=FLAGS),
                   Extension("analyzer._folds", ["analyzer/_folds.c"], optional=True, depends=["analyzer/_slots.h"],
                             extra_compile_args=FLAGS),
                   Extension("analyzer.detectors._profile", ["analyzer/detectors/_profile.c"], optional=True,
                             extra_compile_args=FLAGS)])
