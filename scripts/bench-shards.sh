#!/usr/bin/env bash
# Topic shards against one router: fan-in (CLIENTS publishers, each on its own topic, into
# one wildcard subscriber) with the broker unpinned on every core, at `[router] shards = 1`
# and at `shards = SHARDS`, alternating run by run so that both see the same machine.
# Prints the median delivered/s of each and their ratio.
#
# Knobs (environment): REPS (3), DURATION (10 s), CLIENTS (100), SHARDS (2), QOS ("0 1"),
# PAYLOAD (64), STARLING_BIN, BENCH_BIN (default: the release builds under target/).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
REPS=${REPS:-3}
DURATION=${DURATION:-10}
CLIENTS=${CLIENTS:-100}
SHARDS=${SHARDS:-2}
QOS=${QOS:-0 1}
PAYLOAD=${PAYLOAD:-64}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${STARLING_BIN:-}" ] || [ -z "${BENCH_BIN:-}" ]; then
  cargo build --release -p starling -p starling-bench >&2
fi
STARLING_BIN=${STARLING_BIN:-$TARGET_DIR/release/starling}
BENCH_BIN=${BENCH_BIN:-$TARGET_DIR/release/starling-bench}
OUT="$TARGET_DIR/bench-shards/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
PORT=19400

run() { # shards qos rep -> delivered/s
  local shards=$1 qos=$2 rep=$3 dir pid v
  dir="$OUT/s$shards-q$qos-$rep"
  mkdir -p "$dir"
  PORT=$((PORT + 1))
  printf '[node]\ndata_dir = "%s/data"\n[[listeners]]\nkind = "tcp"\nbind = "127.0.0.1:%s"\n[router]\nshards = %s\n' \
    "$dir" "$PORT" "$shards" >"$dir/starling.toml"
  "$STARLING_BIN" --config "$dir/starling.toml" >"$dir/broker.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.1
  done
  "$BENCH_BIN" fanin -c "$CLIENTS" -q "$qos" -s "$PAYLOAD" -p "$PORT" -d "$DURATION" \
    --broker-pid "$pid" --no-progress >"$dir/result.json" 2>"$dir/summary.txt" || true
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  v=$(python3 -c 'import json,sys
try: print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["delivered_per_s"])
except Exception: print("n/a")' "$dir/result.json")
  echo "bench-shards: shards=$shards qos=$qos #$rep delivered/s = $v" >&2
  echo "$v"
}

median() {
  python3 -c 'import sys, statistics
v = [float(x) for x in sys.argv[1:] if x != "n/a"]
print(round(statistics.median(v)) if v else "n/a")' "$@"
}

echo "| fan-in, $CLIENTS publishers on $CLIENTS topics | shards = 1 | shards = $SHARDS | ratio |"
echo "|---|---:|---:|---:|"
for qos in $QOS; do
  one=() many=()
  for rep in $(seq "$REPS"); do
    one+=("$(run 1 "$qos" "$rep")")
    many+=("$(run "$SHARDS" "$qos" "$rep")")
  done
  a=$(median "${one[@]}")
  b=$(median "${many[@]}")
  ratio=$(python3 -c 'import sys
a, b = sys.argv[1:]
print("n/a" if "n/a" in (a, b) else f"{float(b) / float(a):.2f}x")' "$a" "$b")
  echo "| QoS $qos, delivered/s (median of $REPS) | $a | $b | $ratio |"
done
echo "bench-shards: runs under $OUT" >&2
