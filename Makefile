# Two entry points on a fresh machine: `make demo` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
LAKE   ?= .demo-lake

.PHONY: demo test services venv jvm-archive bench-decode clean

$(STAMP): pyproject.toml setup.py analyzer/_lane.c analyzer/_columns.c analyzer/timeline/_records.c \
		analyzer/timeline/_plain.c analyzer/_folds.c analyzer/_slots.h analyzer/_untrack.h analyzer/_row.h \
		analyzer/detectors/_profile.c
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	-$(PY) -m spark_jobs.jvm_archive --if-missing
	touch $(STAMP)

venv: $(STAMP)

# The CDS archive of Spark's classes that local runs' driver JVMs map (spark_jobs/jvm_archive.py):
# made by the venv's install (and by `make test`, after the services bring Java), again here after a
# Java or pyspark change. Its failure only costs speed.
jvm-archive: $(STAMP)
	$(PY) -m spark_jobs.jvm_archive

# The main job on the bundled sample capture, from decode to what it found.
demo: $(STAMP)
	rm -rf $(LAKE)
	$(VENV)/bin/ackscope demo --lake $(LAKE)

# Installs or starts what the tests talk to (tshark, RabbitMQ, Prometheus), then the whole suite.
test: $(STAMP) services
	-$(PY) -m spark_jobs.jvm_archive --if-missing
	$(PY) -m pytest -q --durations=25 -n 2 --dist loadgroup --no-loadscope-reorder

services:
	bash deploy/ci/services.sh

bench-decode: $(STAMP) services
	$(PY) bench/decode.py

# `ackscope analyze` on a generated lake of 10 M frames (cached in bench/out), local[1] against local[2].
.PHONY: bench-analyze
bench-analyze: $(STAMP)
	$(PY) bench/analyze.py

# A scheduled run after a 5% append, next to a full run of the same lake (1 M generated frames).
.PHONY: bench-incremental
bench-incremental: $(STAMP)
	$(PY) bench/incremental.py

# `ackscope analyze --every` in one driver while frames are appended: 40 runs, memory, disk, equal tables.
.PHONY: bench-every
bench-every: $(STAMP)
	$(PY) bench/every.py

# The live agent on loopback at rising rates beside dumpcap, then 10,000 connections of state (docs/agent.md).
.PHONY: bench-capture
bench-capture: $(STAMP) services
	$(PY) bench/capture.py

# Every generated file from dashboards/: the Prometheus rules, the Grafana JSON, and the Kubernetes
# PrometheusRule and dashboard ConfigMaps (deploy/k8s/base/generated). Run after changing rules or dashboards.
.PHONY: generate
generate: $(STAMP)
	$(PY) -m dashboards.rules
	$(PY) -m dashboards.grafana
	$(PY) -m dashboards.kubernetes

clean:
	rm -rf $(VENV) $(LAKE) .pytest_cache build *.egg-info
