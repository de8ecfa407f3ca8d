#!/usr/bin/env bash
# A two-node Ray cluster on this one machine: a head node and a worker node, token authentication
# on, the dashboard and job server on 127.0.0.1 only. For trying `ray job submit`, multi-node
# placement and the metrics dashboards without a real cluster.
#
#   cluster/local_cluster.sh start    # start both nodes; prints what to export and how to submit
#   cluster/local_cluster.sh status
#   cluster/local_cluster.sh stop     # stops only this cluster's processes (not other Rays)
#
# Settings (environment): AA_RAY_CLUSTER_DIR (state: the auth token and Ray's temp dir; default
# /tmp/aa_ray_cluster), HEAD_CPUS and WORKER_CPUS (2 each), GCS_PORT (6390), DASHBOARD_PORT
# (8266), HEAD_METRICS_PORT (8090) and WORKER_METRICS_PORT (8091), RAY (the ray executable).
# Every port is fixed and off Ray's defaults, so the cluster starts beside another Ray.
set -euo pipefail

RAY=${RAY:-$(command -v ray || echo "$(dirname "$0")/../.venv/bin/ray")}
STATE=${AA_RAY_CLUSTER_DIR:-/tmp/aa_ray_cluster}
HEAD_CPUS=${HEAD_CPUS:-2}
WORKER_CPUS=${WORKER_CPUS:-2}
GCS_PORT=${GCS_PORT:-6390}
DASHBOARD_PORT=${DASHBOARD_PORT:-8266}
HEAD_METRICS_PORT=${HEAD_METRICS_PORT:-8090}
WORKER_METRICS_PORT=${WORKER_METRICS_PORT:-8091}

export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN_PATH="$STATE/auth_token"
# `ray job stop` sends SIGTERM and SIGKILLs after this many seconds (Ray's default: 3); aa-ray's driver
# needs up to runtime.stop_grace_s (25) to end its iteration and write its checkpoint
export RAY_JOB_STOP_WAIT_TIME_S=${RAY_JOB_STOP_WAIT_TIME_S:-30}

start() {
  mkdir -p "$STATE"
  if [ ! -s "$RAY_AUTH_TOKEN_PATH" ]; then  # a fresh random token, readable by this user only
    (umask 077 && python3 -c "import secrets; print(secrets.token_hex(32))" > "$RAY_AUTH_TOKEN_PATH")
  fi
  # Ray's socket paths live under --temp-dir and must stay short, hence a folder of its own. The
  # worker gets a temp dir of its own too: as on separate machines, each node unpacks a job's
  # working dir in its own folder (a shared one would let one node delete the other's copy).
  "$RAY" start --head --port "$GCS_PORT" --num-cpus "$HEAD_CPUS" \
    --dashboard-host 127.0.0.1 --dashboard-port "$DASHBOARD_PORT" \
    --ray-client-server-port $((GCS_PORT + 1)) --dashboard-agent-listen-port $((GCS_PORT + 2)) \
    --runtime-env-agent-port $((GCS_PORT + 3)) --metrics-export-port "$HEAD_METRICS_PORT" \
    --temp-dir "$STATE/ray" --disable-usage-stats
  "$RAY" start --address "127.0.0.1:$GCS_PORT" --num-cpus "$WORKER_CPUS" \
    --dashboard-agent-listen-port $((GCS_PORT + 4)) --runtime-env-agent-port $((GCS_PORT + 5)) \
    --metrics-export-port "$WORKER_METRICS_PORT" --temp-dir "$STATE/ray-worker" --disable-usage-stats
  cat <<EOF

Two-node Ray cluster up (head ${HEAD_CPUS} CPUs + worker ${WORKER_CPUS} CPUs, token authentication on).
Use it from this shell with:
  export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH
  ray job submit --address http://127.0.0.1:$DASHBOARD_PORT --working-dir . -- aa-ray run specs/sac_simba.yaml
Dashboard: http://127.0.0.1:$DASHBOARD_PORT   Metrics: http://127.0.0.1:$HEAD_METRICS_PORT/metrics, :$WORKER_METRICS_PORT/metrics
Prometheus file service discovery: $STATE/ray/prom_metrics_service_discovery.json
EOF
}

stop() {
  # `ray stop` would stop every Ray on the machine; stop the processes under this cluster's temp dir
  pkill -TERM -f -- "$STATE/ray" 2>/dev/null || true  # matches ray-worker too
  for _ in $(seq 20); do
    pgrep -f -- "$STATE/ray" > /dev/null || return 0
    sleep 0.5
  done
  pkill -KILL -f -- "$STATE/ray" 2>/dev/null || true
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) "$RAY" status --address "127.0.0.1:$GCS_PORT" ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
