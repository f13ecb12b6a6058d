#!/usr/bin/env bash
# Does the HTTP API slow MQTT traffic? Fan-out QoS 1 (starling-bench) against a release
# starling with [http] on, alternately with the API idle and with API requests at RATE/s
# (by default GET /api/v1/clients and /api/v1/metrics/prometheus in turn, from python3, one keep-alive
# connection, plus one request held open that never finishes its head), REPS times each. Broker on CPU 0, load and requests on CPU 1. Prints each
# run's delivered/s and the medians. Knobs: REPS (3), DURATION (10), RATE (200), CLIENTS (100),
# PATHS (comma-separated, requested in turn).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
REPS=${REPS:-3}
DURATION=${DURATION:-10}
RATE=${RATE:-200}
CLIENTS=${CLIENTS:-100}
PATHS=${PATHS:-/api/v1/clients,/api/v1/metrics/prometheus}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build --release -p starling -p starling-bench >&2
BIN=$TARGET_DIR/release/starling
BENCH=$TARGET_DIR/release/starling-bench
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
TOML
  taskset -c 0 "$BIN" --config "$dir/s.toml" >"$dir/log" 2>&1 &
  local pid=$! load=""
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$HTTP_PORT") 2>/dev/null && break; sleep 0.1; done
  if [ "$mode" = api ]; then
    taskset -c 1 python3 - "$HTTP_PORT" "$RATE" "$((DURATION + 3))" "$PATHS" <<'PY' >"$dir/api.txt" &
import http.client, socket, sys, time
port, rate, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
# A request held open: its head never ends.
held = socket.create_connection(("127.0.0.1", port))
held.sendall(b"GET /api/v1/clients HTTP/1.1\r\nHost: x\r\n")
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
paths = sys.argv[4].split(",")
start, n, slow = time.monotonic(), 0, 0.0
while time.monotonic() - start < secs:
    t = time.monotonic()
    c.request("GET", paths[n % len(paths)]); r = c.getresponse(); r.read()
    assert r.status == 200, r.status
    slow = max(slow, time.monotonic() - t)
    n += 1
    time.sleep(max(0.0, start + n / rate - time.monotonic()))
print(f"{n} requests, {n / (time.monotonic() - start):.0f}/s, slowest {slow * 1000:.1f} ms")
PY
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
