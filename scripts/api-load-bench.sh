#!/usr/bin/env bash
# Does the HTTP API slow MQTT traffic? Fan-out QoS 1 (starling-bench) against a release
# starling with [http] on, alternately with the API idle and with API requests at RATE/s
# (by default GET /api/v1/clients and /api/v1/metrics/prometheus in turn, from
# starling-api-load: one keep-alive connection, plus one request held open that never
# finishes its head), REPS times each. Broker on CPU 0, load and requests on CPU 1. Prints each
# run's delivered/s and the medians. Knobs: REPS (3), DURATION (10), RATE (200), CLIENTS (100),
# PATHS (comma-separated, requested in turn), HTTP_TOML (more lines for [http], such as
# "list_cache_ms = 0").
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
REPS=${REPS:-3}
DURATION=${DURATION:-10}
RATE=${RATE:-200}
CLIENTS=${CLIENTS:-100}
PATHS=${PATHS:-/api/v1/clients,/api/v1/metrics/prometheus}
HTTP_TOML=${HTTP_TOML:-}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build --release -p starling -p starling-bench >&2
BIN=$TARGET_DIR/release/starling
BENCH=$TARGET_DIR/release/starling-bench
API_LOAD=$TARGET_DIR/release/starling-api-load
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
MQTT_PORT=18850
HTTP_PORT=16070

run() { # run MODE -> delivered/s
  local mode=$1 dir="$WORK/$1-$RANDOM"
  mkdir -p "$dir"
  cat >"$dir/s.toml" <<TOML
[node]
data_dir = "$dir/data"
[[listeners]]
kind = "tcp"
bind = "127.0.0.1:$MQTT_PORT"
allow_anonymous = true
[router]
shards = 1
[http]
enabled = true
bind = "127.0.0.1:$HTTP_PORT"
$HTTP_TOML
TOML
  taskset -c 0 "$BIN" --config "$dir/s.toml" >"$dir/log" 2>&1 &
  local pid=$! load=""
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$HTTP_PORT") 2>/dev/null && break; sleep 0.1; done
  if [ "$mode" = api ]; then
    taskset -c 1 "$API_LOAD" --port "$HTTP_PORT" --rate "$RATE" --secs "$((DURATION + 3))" \
      --paths "$PATHS" >"$dir/api.txt" &
    load=$!
  fi
  taskset -c 1 "$BENCH" fanout -c "$CLIENTS" -q 1 -s 64 -p "$MQTT_PORT" -d "$DURATION" --no-progress \
    2>/dev/null | tail -1 | python3 -c 'import json,sys; print(round(json.loads(sys.stdin.read())["delivered_per_s"]))'
  [ -n "$load" ] && { wait "$load" || true; echo "  api: $(cat "$dir/api.txt")" >&2; }
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

idle=() api=()
for r in $(seq "$REPS"); do
  idle+=("$(run idle)"); echo "idle #$r: ${idle[-1]}" >&2
  api+=("$(run api)"); echo "api  #$r: ${api[-1]}" >&2
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mi=$(median "${idle[@]}") ma=$(median "${api[@]}")
echo "fan-out QoS 1 delivered/s, median of $REPS: API idle $mi, API at $RATE req/s $ma, ratio $(python3 -c "print(f'{$ma/$mi:.2f}')")x"
