#!/usr/bin/env bash
# Installs and starts the real parts the test suite talks to. Idempotent: fast when all is there.
set -euo pipefail

need=()
command -v tshark  >/dev/null || need+=(tshark)
command -v dumpcap >/dev/null || need+=(tshark)
command -v java    >/dev/null || need+=(openjdk-17-jre-headless)
command -v rabbitmq-server >/dev/null || need+=(rabbitmq-server)
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-pushgateway >/dev/null || need+=(prometheus-pushgateway)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
command -v amtool  >/dev/null || need+=(prometheus-alertmanager)
# kubectl renders deploy/k8s offline (tests/test_k8s_manifests.py). The machine image ships it; Debian
# has no package of it, so elsewhere install it from the Kubernetes project's apt repository.
command -v kubectl >/dev/null || echo "services: kubectl is missing: tests/test_k8s_manifests.py will fail" >&2
command -v chromium >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  echo "services: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# RabbitMQ on 127.0.0.1:5672 with guest/guest.
if ! rabbitmqctl -q status >/dev/null 2>&1; then
  echo "services: starting rabbitmq-server" >&2
  rabbitmq-server -detached
fi
rabbitmqctl -q await_startup --timeout 120
# A memory alarm left behind by an interrupted run would block every publisher.
rabbitmqctl -q set_vm_memory_high_watermark 0.4 >/dev/null
echo "services: tshark $(tshark -v 2>/dev/null | head -1 | awk '{print $3}'), rabbitmq $(rabbitmqctl -q version)" >&2
