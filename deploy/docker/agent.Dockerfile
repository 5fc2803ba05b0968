# The capture agent: slim (no JVM, Spark, pandas), non-root, and CAP_NET_RAW as its only privilege.
# Build from the repository root (not buildable on the project's build machines, which have no
# Docker; reviewed, not built, there):
#   docker build -f deploy/docker/agent.Dockerfile -t ackscope-agent:0.1.0 .
# Run with the capability in the container's bounding set and nothing else:
#   docker run --cap-drop ALL --cap-add NET_RAW --network container:rabbitmq ackscope-agent:0.1.0 \
#     capture --iface eth0 --lake /lake
FROM python:3.11-slim-bookworm AS build
# A C compiler for the project's C modules (setup.py: the native decode lane, analyzer/_lane.c, the
# timeline's record maker and its plain frames, the record folds; without them the agent runs their
# Python paths).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY analyzer analyzer
COPY spark_jobs spark_jobs
COPY dashboards dashboards
COPY deploy/docker/requirements.py deploy/docker/requirements.py
# The agent's share of pyproject.toml's pins, then the project itself without the rest.
RUN python deploy/docker/requirements.py > /tmp/requirements.txt \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps .

FROM python:3.11-slim-bookworm
# libpcap: scapy compiles the capture filter with it (in a short-lived child process).
RUN apt-get update && apt-get install -y --no-install-recommends libpcap0.8 libcap2-bin \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
# A non-root user keeps a capability only if the program holds it as a file capability (Kubernetes
# and Docker set no ambient capabilities). The interpreter gets cap_net_raw, the image's only
# program that runs; the container must still be given NET_RAW (cap_add, or the securityContext
# in deploy/k8s): without it in the bounding set the kernel refuses to start the interpreter at all.
RUN setcap cap_net_raw+ep "$(readlink -f /opt/venv/bin/python)" \
    && apt-get purge -y libcap2-bin && apt-get autoremove -y \
    && groupadd --gid 10001 ackscope \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin ackscope \
    && mkdir /lake && chown 10001:10001 /lake
USER 10001:10001
ENV PATH=/opt/venv/bin:$PATH HOME=/tmp PYTHONDONTWRITEBYTECODE=1
VOLUME /lake
EXPOSE 9419
ENTRYPOINT ["ackscope"]
CMD ["capture", "--help"]
