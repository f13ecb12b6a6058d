#!/usr/bin/env bash
# What a three-node cluster costs against one node, on this machine's loopback, with the
# release `starling`: the same starling-bench scenarios against one node alone and against
# the three-node example cluster of config/cluster/ (temp copies with free ports, their own
# data dirs and freshly written certificates), where every delivery crosses nodes:
#
#   pairs-q1   pairs QoS 1: one node / publishers on node 1, subscribers on node 2
#   fanout-q1  fanout QoS 1: one node / the publisher on node 1, subscribers round-robin
#              on nodes 2 and 3 (a publish is PUBACKed once both nodes acknowledged it)
#   fanout-q1-rate  the same at a fixed FANOUT_RATE publishes/s (× CLIENTS deliveries/s),
#              which both should carry without loss: the CPU per delivery at equal load
#              (before b97abf5 back-pressure did not cross nodes, and at an unlimited
#              rate the cluster's remote subscriber queues filled and dropped)
#   conn       CONNECTs of new client ids: one starling-bench / three in parallel, one
#              per node, each with a third of the clients (the cluster figure is the sum
#              of their rates)
#
# Each node's CPU time (utime + stime of /proc/PID/stat) is read before and after every
# run, so the table also gives the brokers' CPU microseconds per delivery (per CONNECT for
# conn): one node's, and the three nodes' together: the CPU cost of a forwarded delivery.
# The single node is config/cluster/node1.toml with [cluster] enabled = false, so that its
# listener, HTTP API and [storage] (the defaults: enabled, fsync "always") are the
# cluster's. Nodes are (re)started per scenario, with empty data dirs.
#
# Knobs (environment): REPS (3 runs per figure, the median is reported), DURATION (5 s per
# run), PAIRS (50), CLIENTS (100 fanout subscribers), PAYLOAD (64 bytes), CONN_CLIENTS
# (9000 in all; a third per cluster node), FANOUT_RATE (5000 publishes/s), CONN_RATE (50000/s cap per starling-bench),
# SCENARIOS (subset of: pairs-q1 fanout-q1 fanout-q1-rate conn), PIN (1: every broker on CPU 0 and
# starling-bench on CPU 1 with taskset, so that one node and the cluster get the same CPU;
# 0: unpinned), BUDGET (CPUs per broker process, e.g. 0.5: each broker, the lone node
# and every cluster node alike, in a cgroup of its own capped at that much CPU time by
# the kernel's CFS quota, unpinned, starling-bench uncapped; each node then has what the
# lone node has, as if each ran on a machine of its own, where PIN=1 gives the three
# nodes together what the lone node has; needs a writable cgroup cpu controller, v1 or
# v2, and overrides PIN), KEEP (1: keep the temp dir and print its path), NO_BUILD (1: use
# the binaries already in the target dir).
# Prints a markdown table (also written to $TMP/table.md, kept with KEEP=1).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

REPS=${REPS:-3}
DURATION=${DURATION:-5}
PAIRS=${PAIRS:-50}
CLIENTS=${CLIENTS:-100}
PAYLOAD=${PAYLOAD:-64}
CONN_CLIENTS=${CONN_CLIENTS:-9000}
CONN_RATE=${CONN_RATE:-50000}
FANOUT_RATE=${FANOUT_RATE:-5000}
SCENARIOS=${SCENARIOS:-pairs-q1 fanout-q1 fanout-q1-rate conn}
PIN=${PIN:-1}
BUDGET=${BUDGET:-}
[ -n "$BUDGET" ] && PIN=0
KEEP=${KEEP:-0}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
EXAMPLE=config/cluster

log() { echo "bench-cluster: $*" >&2; }

command -v python3 >/dev/null || { log "python3 is needed to read the JSON lines"; exit 1; }
if [ "$PIN" = 1 ]; then
  command -v taskset >/dev/null || { log "taskset (util-linux) is needed, or PIN=0"; exit 1; }
  if [ "$(nproc)" -lt 2 ]; then BROKER_CPU=0 LOAD_CPU=0; else BROKER_CPU=0 LOAD_CPU=1; fi
fi
# Command prefixes that pin brokers and starling-bench to their CPUs (empty with PIN=0).
# Prefixes rather than a function, so that `$!` of a backgrounded broker is its own pid
# (taskset execs it).
BROKER_PIN=()
LOAD_PIN=()
if [ "$PIN" = 1 ]; then
  BROKER_PIN=(taskset -c "$BROKER_CPU")
  LOAD_PIN=(taskset -c "$LOAD_CPU")
fi

# With BUDGET: the cgroup directory under which each broker gets a capped group of its
# own, and how a process is put in one (v1: cpu.cfs_quota_us over a 10 ms period, short
# so that a throttled node's stalls stay short; v2: cpu.max).
CG_ROOT=""
CG_DIRS=()
if [ -n "$BUDGET" ]; then
  python3 -c "import sys; sys.exit(0 if 0 < float(sys.argv[1]) <= $(nproc) else 1)" "$BUDGET" 2>/dev/null ||
    { log "BUDGET=$BUDGET: a number of CPUs above 0 and at most $(nproc)"; exit 2; }
  if [ -w /sys/fs/cgroup/cpu ] && [ -e /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    CG_ROOT=/sys/fs/cgroup/cpu CG_KIND=v1
  elif [ -w /sys/fs/cgroup ] && grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
    CG_ROOT=/sys/fs/cgroup CG_KIND=v2
  else
    log "BUDGET needs a writable cgroup cpu controller (v1 /sys/fs/cgroup/cpu, or v2 with cpu in /sys/fs/cgroup/cgroup.subtree_control)"
    exit 1
  fi
  CG_QUOTA=$(python3 -c "print(int(float('$BUDGET') * 10000))")
fi

# budget_group NAME: a fresh capped cgroup; its directory in CG_DIR (and in CG_DIRS).
budget_group() {
  CG_DIR="$CG_ROOT/starling-bench-$$-$1"
  mkdir -p "$CG_DIR"
  if [ "$CG_KIND" = v1 ]; then
    echo 10000 >"$CG_DIR/cpu.cfs_period_us"
    echo "$CG_QUOTA" >"$CG_DIR/cpu.cfs_quota_us"
  else
    echo "$CG_QUOTA 10000" >"$CG_DIR/cpu.max"
  fi
  CG_DIRS+=("$CG_DIR")
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench-cluster.XXXXXX")
PIDS=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  local cg
  for cg in "${CG_DIRS[@]}"; do rmdir "$cg" 2>/dev/null || true; done
  if [ "$KEEP" = 1 ]; then log "kept $TMP"; else rm -rf "$TMP"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- build -----------------------------------------------------------------
if [ "${NO_BUILD:-0}" != 1 ]; then
  log "building starling and starling-bench (release)"
  cargo build --release -p starling --bin starling
  cargo build --release -p starling-bench
fi
BIN="$TARGET_DIR/release/starling"
BENCH="$TARGET_DIR/release/starling-bench"
[ -x "$BIN" ] && [ -x "$BENCH" ] || { log "no $BIN or $BENCH"; exit 1; }

"$BIN" cert cluster "$TMP/certs" --nodes 1,2,3 --name 127.0.0.1 >"$TMP/cert.log" 2>&1 ||
  { cat "$TMP/cert.log" >&2; exit 1; }

# Free ports below the ephemeral range, so that no client socket (starling-bench's, the
# readiness probes') takes one between two scenarios: MQTT and HTTP (TCP) of the lone node
# and of the three nodes, and the three cluster endpoints (UDP), held open together while
# chosen so that none is handed out twice.
read -r SP SH P1 P2 P3 H1 H2 H3 C1 C2 C3 < <(python3 - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
held, ports = [], []
for kind in [socket.SOCK_STREAM] * 8 + [socket.SOCK_DGRAM] * 3:
    while True:
        port = random.randrange(max(1024, low - 12000), low)
        if port in ports:
            continue
        s = socket.socket(socket.AF_INET, kind)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        held.append(s)
        ports.append(port)
        break
print(*ports)
PY
)
MQTT=("" "$P1" "$P2" "$P3")

# node_config N DIR [single]: node N's example config with this run's ports, data dir and
# certificates, in DIR/node.toml; "single" also switches its [cluster] off. Fails if the
# example no longer has what is replaced, rather than benchmark the wrong thing.
node_config() {
  local n=$1 dir=$2 single=${3:-}
  mkdir -p "$dir"
  python3 - "$EXAMPLE/node$n.toml" "$dir/node.toml" "$n" "$dir/data" "$TMP/certs" "$single" \
    "$SP $SH $P1 $P2 $P3 $H1 $H2 $H3 $C1 $C2 $C3" <<'PY'
import re, sys
src, dst, n, data, certs, single, ports = sys.argv[1:]
n = int(n)
sp, sh, *p = ports.split()
old = {str(1883 + i): p[i] for i in range(3)}
old.update({str(6061 + i): p[3 + i] for i in range(3)})
old.update({str(7001 + i): p[6 + i] for i in range(3)})
if single:
    old.update({"1883": sp, "6061": sh})
text = open(src).read()
need = [f'data_dir = "data/node{n}"', 'certs_dir = "certs"', f"127.0.0.1:{1882 + n}",
        f"127.0.0.1:{6060 + n}", "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
for s in need:
    if s not in text:
        sys.exit(f"{src} has no {s!r}: update bench-cluster.sh")
text = text.replace(need[0], f'data_dir = "{data}"').replace(need[1], f'certs_dir = "{certs}"')
# The example's ACL is there for the paho suites; the benchmarks ran without one.
text = text.replace('acl_file = "acl.toml"\n', "")
# One pass, so that a new port is never taken for an old one.
text = re.sub(r"127\.0\.0\.1:(\d+)\b", lambda m: "127.0.0.1:" + old.get(m[1], m[1]), text)
if single:
    text, k = re.subn(r"(\[cluster\]\n(?:[^\[].*\n)*?)enabled = true", r"\1enabled = false", text)
    if k != 1:
        sys.exit(f"{src}: no [cluster] enabled = true to switch off")
open(dst, "w").write(text)
PY
}

# wait_port PORT PID: up to 20 s for the TCP port, while PID lives.
wait_port() {
  for _ in $(seq 200); do
    kill -0 "$2" 2>/dev/null || return 1
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  return 1
}

# start_node CONFIG LOG [GROUP]: starts a broker (with BUDGET, in the capped cgroup
# GROUP; sh execs it there, so that `$!` stays its pid); its pid is then in NODE_PID (and
# in PIDS).
start_node() {
  local enter=()
  if [ -n "$BUDGET" ]; then
    budget_group "$3"
    # shellcheck disable=SC2016 # expanded by that sh
    enter=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG_DIR")
  fi
  "${enter[@]}" "${BROKER_PIN[@]}" "$BIN" --config "$1" >"$2" 2>&1 &
  NODE_PID=$!
  PIDS+=("$NODE_PID")
}

stop_nodes() {
  local pid
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  for pid in "$@"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  local keep=() p
  for p in "${PIDS[@]}"; do [[ " $* " == *" $p "* ]] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

# cluster_ready DIR: up to 30 s for every node to know the leader and the leader to hear
# every member.
cluster_ready() {
  local dir=$1
  for _ in $(seq 60); do
    local ok=1 n
    for n in 1 2 3; do
      "$BIN" cluster status --json --config "$dir/node$n/node.toml" >"$dir/status$n.json" 2>/dev/null || ok=0
    done
    if [ "$ok" = 1 ] && python3 - "$dir" <<'PY'
import json, sys
st = [json.load(open(f"{sys.argv[1]}/status{n}.json")) for n in (1, 2, 3)]
leaders = {s.get("leader") for s in st}
ok = len(leaders) == 1 and None not in leaders
ok = ok and all(m.get("active") is True for m in st[0].get("members", []))
ok = ok and len(st[0].get("members", [])) == 3
sys.exit(0 if ok else 1)
PY
    then
      return 0
    fi
    sleep 0.5
  done
  return 1
}

# cpu_us PID...: utime + stime (fields 14 and 15 of /proc/PID/stat, counted after the
# command name's last ')') of the processes together, in microseconds; n/a if one is gone.
HZ=$(getconf CLK_TCK)
cpu_us() {
  local total=0 pid stat fields
  for pid in "$@"; do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { log "process $pid is gone"; echo n/a; return; }
    read -r -a fields <<<"${stat##*) }"
    total=$((total + fields[11] + fields[12]))
  done
  echo $((total * 1000000 / HZ))
}

# json_fields FILE PATH...: dotted paths of the JSON line in FILE, space-separated (n/a
# for a missing one).
json_fields() {
  python3 - "$@" <<'PY'
import json, sys
try:
    line = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception:
    line = {}
out = []
for path in sys.argv[2:]:
    v = line
    try:
        for k in path.split("."):
            v = v[k]
    except Exception:
        v = None
    out.append("n/a" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v)))
print(" ".join(out))
PY
}

# counters HTTP_PORT...: the nodes' dropped messages (dropped.*), forwards that timed out
# (cluster.forward.timeouts) and back-pressure holds, summed over the nodes, from
# GET /api/v1/metrics of each (its own entry): "dropped timeouts holds", or "n/a n/a n/a".
counters() {
  python3 - "$@" <<'PY'
import json, sys, urllib.request
tot = [0, 0, 0]
try:
    for port in sys.argv[1:]:
        body = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/metrics", timeout=5))
        m = body[0]["metrics"] if len(body) == 1 else None
        if m is None:
            st = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/cluster", timeout=5))
            m = next(e["metrics"] for e in body if e["node"]["id"] == st["node"])
        tot[0] += sum(v for k, v in m.items() if k.startswith("dropped."))
        tot[1] += m.get("cluster.forward.timeouts", 0)
        tot[2] += m.get("backpressure.holds", 0)
    print(*tot)
except Exception:
    print("n/a n/a n/a")
PY
}

median() { # values... (n/a ignored)
  python3 -c 'import sys, statistics
v = [float(x) for x in sys.argv[1:] if x != "n/a"]
print(statistics.median(v) if v else "n/a")' "$@"
}

# --- runs -------------------------------------------------------------------
declare -A VALUE CPU_PER LOST
LOADS=()
RAW="$TMP/runs.txt"
: >"$RAW"

# bench_args SCENARIO SIDE: starling-bench arguments of one run (for conn: of each process).
bench_args() {
  local common="-d $DURATION --no-progress"
  case $1,$2 in
    pairs-q1,single) echo "pairs -c $PAIRS -q 1 -s $PAYLOAD -p $SP $common" ;;
    pairs-q1,cluster) echo "pairs -c $PAIRS -q 1 -s $PAYLOAD -p $P1 --sub-port $P2 $common" ;;
    fanout-q1,single) echo "fanout -c $CLIENTS -q 1 -s $PAYLOAD -p $SP $common" ;;
    fanout-q1,cluster) echo "fanout -c $CLIENTS -q 1 -s $PAYLOAD -p $P1 --sub-port $P2,$P3 $common" ;;
    fanout-q1-rate,single) echo "fanout -c $CLIENTS -q 1 -s $PAYLOAD -r $FANOUT_RATE -p $SP $common" ;;
    fanout-q1-rate,cluster) echo "fanout -c $CLIENTS -q 1 -s $PAYLOAD -r $FANOUT_RATE -p $P1 --sub-port $P2,$P3 $common" ;;
    conn,single) echo "conn -c $CONN_CLIENTS --connect-rate $CONN_RATE -p $SP $common" ;;
    conn,cluster) echo "conn -c $((CONN_CLIENTS / 3)) --connect-rate $CONN_RATE $common" ;;
  esac
}

# run_once SCENARIO SIDE REP DIR PID...: one run against the nodes PID... (the first is
# the one the publishers use); records the figure, the CPU per delivery and the losses.
run_once() {
  local scenario=$1 side=$2 rep=$3 dir=$4
  shift 4
  local pids=("$@") out="$dir/run$rep" args figure count before after http=("$SH")
  [ "$side" = cluster ] && http=("$H1" "$H2" "$H3")
  mkdir -p "$out"
  args=$(bench_args "$scenario" "$side")
  LOADS+=("$(cut -d' ' -f1 /proc/loadavg)")
  local c0 c1
  read -r -a c0 < <(counters "${http[@]}")
  local each0=() each1=() p
  for p in "${pids[@]}"; do each0+=("$(cpu_us "$p")"); done
  before=$(cpu_us "${pids[@]}")
  if [ "$scenario" = conn ] && [ "$side" = cluster ]; then
    local n bpids=()
    for n in 1 2 3; do
      # shellcheck disable=SC2086 # args is a word list on purpose
      "${LOAD_PIN[@]}" "$BENCH" $args -p "${MQTT[$n]}" --broker-pid "${pids[$((n - 1))]}" \
        >"$out/result$n.json" 2>"$out/summary$n.txt" &
      bpids+=($!)
    done
    for n in "${bpids[@]}"; do wait "$n" || true; done
  else
    # shellcheck disable=SC2086 # args is a word list on purpose
    "${LOAD_PIN[@]}" "$BENCH" $args --broker-pid "${pids[0]}" >"$out/result1.json" 2>"$out/summary1.txt" || true
  fi
  after=$(cpu_us "${pids[@]}")
  for p in "${pids[@]}"; do each1+=("$(cpu_us "$p")"); done
  read -r -a c1 < <(counters "${http[@]}")
  local f rate ok fields sum_rate=0 sum_count=0 detail="" lost=0 l
  for f in "$out"/result*.json; do
    if [ "$scenario" = conn ]; then
      read -r rate ok l fields < <(json_fields "$f" connect.rate_per_s connect.ok connect.failed errors first_error)
      detail+=" [ok $ok failed $l errors ${fields}]"
    else
      read -r rate ok l fields < <(json_fields "$f" delivered_per_s received lost sent acked expected duplicates errors latency_us.p50 latency_us.p99 first_error)
      detail+=" [received $ok lost $l sent/acked/expected/dup/errors/p50 µs/p99 µs ${fields}]"
    fi
    if [ "$l" = n/a ] || [ "$lost" = n/a ]; then lost=n/a; else lost=$((lost + l)); fi
    if [ "$rate" = n/a ] || [ "$ok" = n/a ]; then sum_rate=n/a; break; fi
    sum_rate=$(python3 -c "print($sum_rate + $rate)")
    sum_count=$((sum_count + ok))
  done
  figure=$sum_rate
  count=$sum_count
  local per=n/a
  if [ "$figure" != n/a ] && [ "$count" -gt 0 ] && [ "$before" != n/a ] && [ "$after" != n/a ]; then
    per=$(python3 -c "print(($after - $before) / $count)")
  fi
  VALUE[$scenario,$side]+=" $figure"
  LOST[$scenario,$side]+=" $lost"
  CPU_PER[$scenario,$side]+=" $per"
  local cpu_ms=n/a
  if [ "$before" != n/a ] && [ "$after" != n/a ]; then
    cpu_ms="$(((after - before) / 1000)) ms"
    if [ "${#pids[@]}" -gt 1 ]; then
      local i split=()
      for i in "${!pids[@]}"; do split+=("$(((each1[i] - each0[i]) / 1000))"); done
      cpu_ms+=" (nodes 1/2/3: $(IFS=/; echo "${split[*]}") ms)"
    fi
  fi
  local counted="n/a"
  if [ "${c0[0]}" != n/a ] && [ "${c1[0]}" != n/a ]; then
    counted="dropped $((c1[0] - c0[0])), forward timeouts $((c1[1] - c0[1])), back-pressure holds $((c1[2] - c0[2]))"
  fi
  local msg="$scenario $side #$rep: $figure/s, brokers' CPU $cpu_ms, $per µs each; brokers: $counted;$detail"
  echo "$msg" >>"$RAW"
  log "$msg"
}

for scenario in $SCENARIOS; do
  case $scenario in pairs-q1|fanout-q1|fanout-q1-rate|conn) ;; *) log "unknown scenario $scenario"; exit 2 ;; esac
  # One node alone.
  dir="$TMP/$scenario/single"
  node_config 1 "$dir/node1" single
  start_node "$dir/node1/node.toml" "$dir/node1/broker.log" "$scenario-single"
  pid=$NODE_PID
  wait_port "$SP" "$pid" || { log "the lone node did not start:"; cat "$dir/node1/broker.log" >&2; exit 1; }
  for rep in $(seq "$REPS"); do run_once "$scenario" single "$rep" "$dir" "$pid"; done
  stop_nodes "$pid"

  # The three-node cluster.
  dir="$TMP/$scenario/cluster"
  cpids=()
  for n in 1 2 3; do
    node_config "$n" "$dir/node$n"
    start_node "$dir/node$n/node.toml" "$dir/node$n/broker.log" "$scenario-node$n"
    cpids+=("$NODE_PID")
  done
  for n in 1 2 3; do
    wait_port "${MQTT[$n]}" "${cpids[$((n - 1))]}" ||
      { log "node $n did not start:"; cat "$dir/node$n/broker.log" >&2; exit 1; }
  done
  cluster_ready "$dir" || { log "the cluster did not elect a leader heard by all:"; cat "$dir"/status*.json >&2; exit 1; }
  for rep in $(seq "$REPS"); do run_once "$scenario" cluster "$rep" "$dir" "${cpids[@]}"; done
  stop_nodes "${cpids[@]}"
done

# --- table ------------------------------------------------------------------
TABLE="$TMP/table.md"
{
  echo "| scenario | metric | one node | cluster | ratio (cluster/one node) | CPU µs per delivery, one node | CPU µs per delivery, cluster (3 nodes) | lost (conn: failed), one node / cluster |"
  echo "|---|---|---|---|---|---|---|---|"
  for scenario in $SCENARIOS; do
    case $scenario in
      pairs-q1) what="pairs QoS 1, $PAIRS pairs (cluster: publishers on node 1, subscribers on node 2)"; metric="deliveries/s" ;;
      fanout-q1) what="fanout QoS 1, 1 → $CLIENTS (cluster: publisher on node 1, subscribers on nodes 2 and 3)"; metric="deliveries/s" ;;
      fanout-q1-rate) what="fanout QoS 1 at $FANOUT_RATE msg/s → $CLIENTS (as above)"; metric="deliveries/s" ;;
      conn) what="conn, $CONN_CLIENTS new client ids (cluster: $((CONN_CLIENTS / 3)) per node, 3 processes)"; metric="CONNECTs/s (CPU per CONNECT)" ;;
    esac
    # shellcheck disable=SC2086 # the recorded values are a word list
    python3 - "$what" "$metric" "$(median ${VALUE[$scenario,single]})" "$(median ${VALUE[$scenario,cluster]})" \
      "$(median ${CPU_PER[$scenario,single]})" "$(median ${CPU_PER[$scenario,cluster]})" \
      "$(median ${LOST[$scenario,single]})" "$(median ${LOST[$scenario,cluster]})" <<'PY'
import sys
what, metric, one, cl, cpu1, cpu3, lost1, lost3 = sys.argv[1:]
f = lambda v, d=0: "n/a" if v == "n/a" else f"{float(v):,.{d}f}"
ratio = "n/a" if "n/a" in (one, cl) or float(one) == 0 else f"{float(cl) / float(one):.2f}x"
print(f"| {what} | {metric} | {f(one)} | {f(cl)} | {ratio} | {f(cpu1, 1)} | {f(cpu3, 1)} | {f(lost1)} / {f(lost3)} |")
PY
  done
} >"$TABLE"
echo
cat "$TABLE"
echo
echo "Median of $REPS runs of $DURATION s, $PAYLOAD-byte payloads, MQTT 3.1.1; $(nproc) CPUs;" \
  "$(if [ -n "$BUDGET" ]; then echo "each broker process capped at $BUDGET CPU (cgroup $CG_KIND CFS quota), starling-bench uncapped, unpinned"
      elif [ "$PIN" = 1 ]; then echo "brokers on CPU $BROKER_CPU, starling-bench on CPU $LOAD_CPU"
      else echo "unpinned"; fi)."
echo "CPU per delivery: the brokers' utime + stime over the whole run (connections, publishing, drain) per delivery received (per CONNECT for conn); lost: median per run."
echo "1-minute load average at the start of each run (min/median/max): $(python3 -c 'import sys, statistics
v = [float(x) for x in sys.argv[1:]]
print("%.2f / %.2f / %.2f" % (min(v), statistics.median(v), max(v)) if v else "n/a")' "${LOADS[@]}")."
echo
echo "Runs:"
sed 's/^/  /' "$RAW"
