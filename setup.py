"""The native lane (analyzer/_lane.c) is the only thing setup.py adds to pyproject.toml. It is
optional: where it does not compile, the decoder runs its Python path (analyzer/native.py), and
tests/test_native_lane.py fails under CI=true so that this never goes unnoticed there."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("analyzer._lane", ["analyzer/_lane.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers", "-Wno-cast-function-type"])])
