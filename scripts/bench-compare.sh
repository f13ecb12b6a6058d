#!/usr/bin/env bash
# Side-by-side broker benchmark: the same starling-bench scenarios against
# Starling, Mosquitto and (when on PATH) RMQTT (`rmqttd`) and rumqttd, in one
# run on one machine. Each broker is pinned to CPU 0 and the load to CPU 1,
# the broker is restarted before every run, the brokers take turns run by run,
# and each figure is the median of REPS runs. Prints a table of Starling/peer ratios and writes it
# between the markers of docs/benchmarks.md.
#
# Knobs (environment): REPS (3), DURATION (10 s per run), CLIENTS (100),
# PAIRS (50), PAYLOAD (64), CONN_CLIENTS (10000), SCENARIOS (space-separated
# subset of the names below), BROKERS (subset of: starling mosquitto rmqtt
# rumqttd starling-base starling-mem mosquitto-persist), RMQTTD_ARGS / RMQTTD_PORT (how to start RMQTT, default: its own
# defaults on 1883), DOC (docs/benchmarks.md).
#
# A/B against an earlier Starling: STARLING_BASE_BIN=path/to/old/starling and
# BROKERS="starling starling-base" (the ratio column is then new/old). STARLING_TOML is
# appended to both Starling configurations (e.g. an [auth] section with an acl_file), so
# that a feature's cost is measured with it switched on; STARLING_BASE_TOML, when set,
# replaces it for starling-base (e.g. empty, to compare against the old build as it ran).
#
# A broker that cannot be built, found or started gets n/a, never a failure
# of the whole run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

REPS=${REPS:-3}
DURATION=${DURATION:-10}
CLIENTS=${CLIENTS:-100}
PAIRS=${PAIRS:-50}
PAYLOAD=${PAYLOAD:-64}
CONN_CLIENTS=${CONN_CLIENTS:-10000}
DOC=${DOC:-docs/benchmarks.md}
BROKERS=${BROKERS:-starling mosquitto rmqtt rumqttd}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT="$TARGET_DIR/bench-compare/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"

# name | starling-bench arguments | figure read from the JSON line | better
SCENARIO_TABLE="
fanin-q0|fanin -c $CLIENTS -q 0 -s $PAYLOAD|delivered_per_s|higher
fanin-q1|fanin -c $CLIENTS -q 1 -s $PAYLOAD|delivered_per_s|higher
fanout-q0|fanout -c $CLIENTS -q 0 -s $PAYLOAD|delivered_per_s|higher
fanout-q1|fanout -c $CLIENTS -q 1 -s $PAYLOAD|delivered_per_s|higher
pairs-q0|pairs -c $PAIRS -q 0 -s $PAYLOAD|delivered_per_s|higher
pairs-q1|pairs -c $PAIRS -q 1 -s $PAYLOAD|delivered_per_s|higher
fanin-q1-20k-p99|fanin -c $CLIENTS -q 1 -r 20000 -s $PAYLOAD|latency_us.p99|lower
pairs-q1-20k-p99|pairs -c $PAIRS -q 1 -r 20000 -s $PAYLOAD|latency_us.p99|lower
fanout-q1-50k-p99|fanout -c $CLIENTS -q 1 -r $((50000 / CLIENTS)) -s $PAYLOAD|latency_us.p99|lower
persist-fanin-q1|fanin -c $CLIENTS -q 1 -s $PAYLOAD --persistent|delivered_per_s|higher
persist-pairs-q1|pairs -c $PAIRS -q 1 -s $PAYLOAD --persistent|delivered_per_s|higher
persist-fanin-q1-5k-p99|fanin -c $CLIENTS -q 1 -r 5000 -s $PAYLOAD --persistent|latency_us.p99|lower
persist-pairs-q1-5k-p99|pairs -c $PAIRS -q 1 -r 5000 -s $PAYLOAD --persistent|latency_us.p99|lower
conn-rate|conn -c $CONN_CLIENTS --connect-rate 50000|connect.rate_per_s|higher
conn-rss|conn -c $CONN_CLIENTS --connect-rate 50000|broker_rss.per_connection_bytes|lower
"
# The persistent-session rows (subscribers with persistent sessions, so a broker with a
# store writes their deliveries) are run only when asked for, with the brokers that tell
# them apart: starling-mem (the same build, storage.enabled = false) and mosquitto-persist
# (persistence true, its defaults otherwise).
SCENARIOS=${SCENARIOS:-$(echo "$SCENARIO_TABLE" | awk -F'|' 'NF && $1 !~ /^persist-/ { print $1 }' | tr '\n' ' ')}

log() { echo "bench-compare: $*" >&2; }

command -v python3 >/dev/null || { log "python3 is needed to read the JSON lines"; exit 1; }
command -v taskset >/dev/null || { log "taskset (util-linux) is needed"; exit 1; }
if [ "$(nproc)" -lt 2 ]; then
  log "fewer than 2 CPUs: broker and load share a core, ratios only"
  BROKER_CPU=0 LOAD_CPU=0
else
  BROKER_CPU=0 LOAD_CPU=1
fi

# --- build -----------------------------------------------------------------
log "building starling-bench (release)"
cargo build --release -p starling-bench
BENCH="$TARGET_DIR/release/starling-bench"
STARLING_BIN=""
if [[ " $BROKERS " != *" starling "* ]]; then
  :
elif cargo build --release -p starling --bin starling; then
  STARLING_BIN="$TARGET_DIR/release/starling"
else
  log "Starling does not build: its column is n/a"
fi

# --- peers ------------------------------------------------------------------
MOSQUITTO_BIN=$(command -v mosquitto || true)
[ -z "$MOSQUITTO_BIN" ] && [ -x /usr/sbin/mosquitto ] && MOSQUITTO_BIN=/usr/sbin/mosquitto
if [ -z "$MOSQUITTO_BIN" ] && [[ " $BROKERS " == *" mosquitto "* ]]; then
  log "installing mosquitto from Debian"
  if (apt-get update -qq && apt-get install -y -qq mosquitto) >"$OUT/apt.log" 2>&1; then
    MOSQUITTO_BIN=/usr/sbin/mosquitto
  else
    log "mosquitto install failed (see $OUT/apt.log): its column is n/a"
  fi
fi
STARLING_BASE_BIN=${STARLING_BASE_BIN:-}
STARLING_TOML=${STARLING_TOML:-}
STARLING_BASE_TOML=${STARLING_BASE_TOML-$STARLING_TOML}
RMQTTD_BIN=$(command -v rmqttd || true)
RUMQTTD_BIN=$(command -v rumqttd || true)

# --- brokers ----------------------------------------------------------------
# start_broker NAME PORT DIR: starts NAME pinned to BROKER_CPU, prints its pid
# and the port it listens on ("pid port"), or nothing if it is not available.
start_broker() {
  local name=$1 port=$2 dir=$3 pid=""
  mkdir -p "$dir"
  case $name in
    starling|starling-base|starling-mem)
      local bin=$STARLING_BIN extra=$STARLING_TOML
      [ "$name" = starling-base ] && bin=$STARLING_BASE_BIN extra=$STARLING_BASE_TOML
      [ "$name" = starling-mem ] && extra=$(printf '%s\n[storage]\nenabled = false' "$STARLING_TOML")
      [ -n "$bin" ] || return 0
      cat >"$dir/starling.toml" <<TOML
[node]
data_dir = "$dir/data"

[[listeners]]
kind = "tcp"
bind = "127.0.0.1:$port"
allow_anonymous = true
$extra
TOML
      taskset -c "$BROKER_CPU" "$bin" --config "$dir/starling.toml" >"$dir/broker.log" 2>&1 &
      pid=$! ;;
    mosquitto|mosquitto-persist)
      [ -n "$MOSQUITTO_BIN" ] || return 0
      printf 'listener %s 127.0.0.1\nallow_anonymous true\nmax_connections -1\n' "$port" >"$dir/mosquitto.conf"
      [ "$name" = mosquitto-persist ] &&
        printf 'persistence true\npersistence_location %s/\n' "$dir" >>"$dir/mosquitto.conf"
      taskset -c "$BROKER_CPU" "$MOSQUITTO_BIN" -c "$dir/mosquitto.conf" >"$dir/broker.log" 2>&1 &
      pid=$! ;;
    rmqtt)
      [ -n "$RMQTTD_BIN" ] || return 0
      port=${RMQTTD_PORT:-1883}
      # shellcheck disable=SC2086 # RMQTTD_ARGS is a word list on purpose
      (cd "$dir" && exec taskset -c "$BROKER_CPU" "$RMQTTD_BIN" ${RMQTTD_ARGS:-}) >"$dir/broker.log" 2>&1 &
      pid=$! ;;
    rumqttd)
      [ -n "$RUMQTTD_BIN" ] || return 0
      cat >"$dir/rumqttd.toml" <<TOML
id = 0
[router]
id = 0
max_connections = 20010
max_outgoing_packet_count = 200
max_segment_size = 104857600
max_segment_count = 10
[v4.1]
name = "v4-1"
listen = "127.0.0.1:$port"
next_connection_delay_ms = 1
    [v4.1.connections]
    connection_timeout_ms = 60000
    max_payload_size = 20480
    max_inflight_count = 100
    dynamic_filters = true
TOML
      taskset -c "$BROKER_CPU" "$RUMQTTD_BIN" --config "$dir/rumqttd.toml" >"$dir/broker.log" 2>&1 &
      pid=$! ;;
  esac
  # Wait up to 10 s for the port.
  for _ in $(seq 100); do
    if ! kill -0 "$pid" 2>/dev/null; then return 0; fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$pid $port"
      return 0
    fi
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
}

stop_broker() {
  local pid=$1
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

# json_field FILE PATH: a dotted path of the JSON line in FILE, or n/a.
json_field() {
  python3 - "$1" "$2" <<'PY'
import json, sys
try:
    v = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
    for k in sys.argv[2].split('.'):
        v = v[k]
    print('n/a' if v is None else v)
except Exception:
    print('n/a')
PY
}

median() { # values... (n/a ignored)
  python3 -c 'import sys, statistics
v = [float(x) for x in sys.argv[1:] if x != "n/a"]
print(statistics.median(v) if v else "n/a")' "$@"
}

# --- runs -------------------------------------------------------------------
PORT=18900
declare -A RESULT
# The 1-minute load average before each run: the machine is shared, and the doc says how
# busy it was while these figures were taken.
LOADS=()
for scenario in $SCENARIOS; do
  line=$(echo "$SCENARIO_TABLE" | awk -F'|' -v s="$scenario" '$1 == s')
  [ -n "$line" ] || { log "unknown scenario $scenario"; exit 2; }
  IFS='|' read -r _ args field _ <<<"$line"
  # The brokers take turns, a run each per repetition, so that a machine that speeds up
  # or slows down over the minutes of a row moves every broker's runs alike.
  declare -A VALUES=()
  for rep in $(seq "$REPS"); do
    for broker in $BROKERS; do
      PORT=$((PORT + 1))
      dir="$OUT/$broker/$scenario/$rep"
      started=$(start_broker "$broker" "$PORT" "$dir")
      if [ -z "$started" ]; then
        VALUES[$broker]+=" n/a"
        continue
      fi
      read -r pid port <<<"$started"
      LOADS+=("$(cut -d' ' -f1 /proc/loadavg)")
      # shellcheck disable=SC2086 # args is a word list on purpose
      taskset -c "$LOAD_CPU" "$BENCH" $args -p "$port" -d "$DURATION" \
        --broker-pid "$pid" --no-progress >"$dir/result.json" 2>"$dir/summary.txt" || true
      value=$(json_field "$dir/result.json" "$field")
      VALUES[$broker]+=" $value"
      stop_broker "$pid"
      log "$broker $scenario #$rep: $field = $value"
    done
  done
  for broker in $BROKERS; do
    # shellcheck disable=SC2086 # the values are a word list on purpose
    RESULT[$broker,$scenario]=$(median ${VALUES[$broker]})
  done
  unset VALUES
done

# --- table ------------------------------------------------------------------
# Ratios are Starling/peer for "higher is better" figures and peer/Starling
# for "lower is better" ones, so that above 1 always means Starling is ahead.
TABLE="$OUT/table.md"
{
  header="| scenario | figure |"
  rule="|---|---|"
  for b in $BROKERS; do header+=" $b |"; rule+="---|"; done
  for b in $BROKERS; do [ "$b" = starling ] || { header+=" Starling vs $b |"; rule+="---|"; }; done
  echo "$header"
  echo "$rule"
  for scenario in $SCENARIOS; do
    line=$(echo "$SCENARIO_TABLE" | awk -F'|' -v s="$scenario" '$1 == s')
    IFS='|' read -r _ _ field better <<<"$line"
    row="| $scenario | $field ($better is better) |"
    for b in $BROKERS; do row+=" $(python3 -c 'import sys; v=sys.argv[1]; print(v if v=="n/a" else f"{float(v):.0f}")' "${RESULT[$b,$scenario]}") |"; done
    for b in $BROKERS; do
      [ "$b" = starling ] && continue
      row+=" $(python3 -c '
import sys
s, p, better = sys.argv[1:]
if "n/a" in (s, p) or float(s) == 0 or float(p) == 0:
    print("n/a")
else:
    r = float(s) / float(p) if better == "higher" else float(p) / float(s)
    print(f"{r:.2f}x")' "${RESULT[starling,$scenario]:-n/a}" "${RESULT[$b,$scenario]}" "$better") |"
    done
    echo "$row"
  done
} >"$TABLE"
cat "$TABLE"

# --- docs -------------------------------------------------------------------
BEGIN='<!-- bench-compare:begin -->'
END='<!-- bench-compare:end -->'
SECTION="$OUT/section.md"
{
  echo "$BEGIN"
  echo "## Broker throughput and latency"
  echo
  echo "Written by \`just bench-compare\` ($(date -u +%Y-%m-%d), $(nproc) CPUs, $(uname -m));"
  echo "broker on CPU $BROKER_CPU, load on CPU $LOAD_CPU, restarted per run, the brokers"
  echo "taking turns run by run; median of $REPS runs of $DURATION s, $PAYLOAD-byte payloads, MQTT 3.1.1."
  echo "Ratios above 1 mean Starling is ahead (higher throughput, lower latency or memory)."
  echo "Machine load (1-minute load average at the start of each run, min/median/max):"
  echo "$(python3 -c 'import sys, statistics
v = [float(x) for x in sys.argv[1:]]
print("%.1f / %.1f / %.1f" % (min(v), statistics.median(v), max(v)) if v else "n/a")' "${LOADS[@]}")."
  echo "Peers: $(for b in $BROKERS; do
      case $b in
        mosquitto) [ -n "$MOSQUITTO_BIN" ] && printf 'Mosquitto %s; ' "$("$MOSQUITTO_BIN" -h 2>/dev/null | head -1 | awk '{print $3}')" ;;
        rmqtt) [ -n "$RMQTTD_BIN" ] && printf 'RMQTT %s; ' "$("$RMQTTD_BIN" --version 2>/dev/null | head -1 | awk '{print $1}' | sed 's|^rmqtt/||; s|-.*||')" ;;
        rumqttd) [ -n "$RUMQTTD_BIN" ] && printf 'rumqttd %s; ' "$("$RUMQTTD_BIN" --version 2>/dev/null | head -1 | awk '{print $NF}')" ;;
      esac
    done)"
  echo
  cat "$TABLE"
  echo "$END"
} >"$SECTION"
mkdir -p "$(dirname "$DOC")"
[ -f "$DOC" ] || printf '# Benchmarks\n' >"$DOC"
python3 - "$DOC" "$SECTION" "$BEGIN" "$END" <<'PY'
import sys
doc, section, begin, end = sys.argv[1:]
text = open(doc).read()
new = open(section).read().rstrip("\n")
if begin in text and end in text:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    text = head + new + tail
else:
    text = text.rstrip("\n") + "\n\n" + new + "\n"
open(doc, "w").write(text)
PY
log "raw results in $OUT; table written to $DOC"
