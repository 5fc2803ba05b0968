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
	-$(PY) -m spark_jobs.make_jvm_archive --if-missing
	touch $(STAMP)

venv: $(STAMP)

# The CDS archive of Spark's classes that local runs' driver JVMs map (spark_jobs/jvm_archive.py, made by make_jvm_archive.py):
# made by the venv's install (and by `make test`, after the services bring Java), again here after a
# Java or pyspark change. Its failure only costs speed.
jvm-archive: $(STAMP)
	$(PY) -m spark_jobs.make_jvm_archive

# The main job on the bundled sample capture, from decode to what it found.
demo: $(STAMP)
	rm -rf $(LAKE)
	$(VENV)/bin/ackscope demo --lake $(LAKE)

# The rule, timeline, detector and pass tests, run a second time in pure Python (DESIGN.md: the
# reference stays whole beside its C twins); the twins' own differential tests (c_twin) are left out.
PURE_PYTHON_TESTS := tests/test_timeline.py tests/test_records.py tests/test_state.py tests/test_carry.py \
	tests/test_detectors_python.py tests/test_detector_state.py tests/test_detector_folds.py \
	tests/test_message_kinds.py tests/test_channel_metrics_python.py tests/test_connection_pass.py \
	tests/test_pure_python.py

# Installs or starts what the tests talk to (tshark, RabbitMQ, Prometheus), then the whole suite,
# then PURE_PYTHON_TESTS again with ACKSCOPE_PURE_PYTHON=1.
test: $(STAMP) services
	-$(PY) -m spark_jobs.make_jvm_archive --if-missing
	$(PY) -m pytest -q --durations=25 -n 2 --dist loadgroup --no-loadscope-reorder
	ACKSCOPE_PURE_PYTHON=1 $(PY) -m pytest -q --durations=10 -n 2 --dist loadgroup --no-loadscope-reorder \
		-m "not c_twin" $(PURE_PYTHON_TESTS)

services:
	bash deploy/ci/services.sh

bench-decode: $(STAMP) services
	$(PY) bench/decode.py

# amqps: `ackscope ingest --tls-keylog` against `tshark -o tls.keylog_file` on recorded TLS 1.3 traffic.
.PHONY: bench-tls
bench-tls: $(STAMP) services
	$(PY) bench/tls.py --messages 200000

# `ackscope ingest` of a ring of files against one file of the same capture (issue 61: <= 5% slower).
.PHONY: bench-pieces
bench-pieces: $(STAMP) services
	nice -n 10 $(PY) bench/pieces.py

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

# The live agent under issue 62's connection churn for 30 minutes (MINUTES=...), niced: RSS, CPU,
# frames/s and files on disk every minute, the RSS slope at the end (docs/deployment.md).
MINUTES ?= 30
.PHONY: bench-soak
bench-soak: $(STAMP) services
	nice -n 10 $(PY) bench/soak.py --minutes $(MINUTES)

# The agent's compaction against delta-rs's optimize.compact, peak RSS of each in the same run.
.PHONY: bench-compaction
bench-compaction: $(STAMP)
	nice -n 10 $(PY) bench/compaction.py

# Every generated file from dashboards/: the Prometheus rules, the Grafana JSON, and the Kubernetes
# PrometheusRule and dashboard ConfigMaps (deploy/k8s/base/generated). Run after changing rules or dashboards.
.PHONY: generate
generate: $(STAMP)
	$(PY) -m dashboards.rules
	$(PY) -m dashboards.grafana
	$(PY) -m dashboards.kubernetes

clean:
	rm -rf $(VENV) $(LAKE) .pytest_cache build *.egg-info
