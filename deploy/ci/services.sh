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

# RabbitMQ on 127.0.0.1:5672 with guest/guest. A node just started with -detached is not reachable
# by rabbitmqctl for a few seconds: await_startup fails until it is, so wait for it first.
start_rabbitmq() {
  rabbitmq-server -detached
  for _ in $(seq 1 60); do rabbitmqctl -q status >/dev/null 2>&1 && break; sleep 1; done
}
if ! rabbitmqctl -q status >/dev/null 2>&1; then
  echo "services: starting rabbitmq-server" >&2
  start_rabbitmq
fi
rabbitmqctl -q await_startup --timeout 120

# RabbitMQ over TLS on 127.0.0.1:5671 (amqps) beside 5672, TLS 1.2 and 1.3: a CA and a broker
# certificate made here, outside the repo (never committed keys), readable by the broker only.
# The broker restarts only when its configuration changed (it is shared by everyone's tests).
tls_dir=/var/lib/ackscope-test-tls
if [ ! -s "$tls_dir/server.pem" ]; then
  echo "services: making the test CA and broker certificate in $tls_dir" >&2
  install -d -m 0750 -g rabbitmq "$tls_dir"
  (
    cd "$tls_dir"
    umask 027
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=ackscope test CA" \
      -keyout ca.key -out ca.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
      -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile server.ext -out server.pem.tmp 2>/dev/null
    chgrp rabbitmq server.key server.pem.tmp ca.pem
    chmod 0640 server.key
    chmod 0644 ca.pem
    mv server.pem.tmp server.pem
  )
fi
conf=/etc/rabbitmq/rabbitmq.conf
tls_conf="# ackscope test TLS listener (deploy/ci/services.sh)
listeners.ssl.default = 127.0.0.1:5671
ssl_options.cacertfile = $tls_dir/ca.pem
ssl_options.certfile = $tls_dir/server.pem
ssl_options.keyfile = $tls_dir/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
ssl_options.versions.1 = tlsv1.3
ssl_options.versions.2 = tlsv1.2"
current=$(sed -n '/^# ackscope test TLS listener/,/^ssl_options.versions.2/p' "$conf" 2>/dev/null || true)
if [ "$current" != "$tls_conf" ]; then
  echo "services: configuring the TLS listener on 5671, restarting rabbitmq-server" >&2
  touch "$conf"
  sed -i '/^# ackscope test TLS listener/,/^ssl_options.versions.2/d' "$conf"
  printf '%s\n' "$tls_conf" >>"$conf"
  rabbitmqctl -q stop >/dev/null 2>&1 || true
  start_rabbitmq
  rabbitmqctl -q await_startup --timeout 120
fi
# A memory alarm left behind by an interrupted run would block every publisher.
rabbitmqctl -q set_vm_memory_high_watermark 0.4 >/dev/null
echo "services: tshark $(tshark -v 2>/dev/null | head -1 | awk '{print $3}'), rabbitmq $(rabbitmqctl -q version)" >&2
