#!/usr/bin/env bash
# Real-client checks against a running broker: QoS 0/1/2 round trips, retained messages,
# wills and persistent sessions with mosquitto_pub/mosquitto_sub (MQTT 3.1, 3.1.1, 5.0),
# Python paho-mqtt (3.1.1, 5.0) and MQTT.js (3.1.1, 5.0; tests/js/interop.js, after
# `npm ci` in tests/js). tests/real_clients.rs runs it against an in-process broker.
#
#   real-clients.sh HOST PORT        (needs mosquitto-clients; python3 with paho-mqtt >= 2)
set -u
HOST=${1:-127.0.0.1}; PORT=${2:-1883}
PY=${PYTHON:-python3}
pass=0; fail=0
ok() { echo "PASS $1"; pass=$((pass+1)); }
ko() { echo "FAIL $1: $2"; fail=$((fail+1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null' EXIT

for V in mqttv31 mqttv311 mqttv5; do
  # QoS 0/1/2 round trips.
  for Q in 0 1 2; do
    t="rc/qos/$V/$Q/$$"
    timeout 5 mosquitto_sub -h "$HOST" -p "$PORT" -V $V -t "$t" -q $Q -C 1 -i "rcq-s-$V-$Q" >"$tmp/q.$V.$Q" & s=$!
    sleep 0.3
    mosquitto_pub -h "$HOST" -p "$PORT" -V $V -t "$t" -q $Q -m "hello-$Q" -i "rcq-p-$V-$Q"
    wait $s
    [ "$(cat "$tmp/q.$V.$Q")" = "hello-$Q" ] && ok "mosquitto/$V/qos$Q" || ko "mosquitto/$V/qos$Q" "got '$(cat "$tmp/q.$V.$Q")'"
  done

  # Retained: stored, delivered to a later subscriber, cleared by an empty payload.
  t="rc/retain/$V/$$"
  mosquitto_pub -h "$HOST" -p "$PORT" -V $V -t "$t" -q 1 -r -m "kept-$V"
  got=$(timeout 3 mosquitto_sub -h "$HOST" -p "$PORT" -V $V -t "$t" -C 1 -W 2 2>/dev/null)
  [ "$got" = "kept-$V" ] && ok "mosquitto/$V/retained" || ko "mosquitto/$V/retained" "got '$got'"
  mosquitto_pub -h "$HOST" -p "$PORT" -V $V -t "$t" -q 1 -r -n
  got=$(timeout 3 mosquitto_sub -h "$HOST" -p "$PORT" -V $V -t "$t" -C 1 -W 1 2>/dev/null)
  [ -z "$got" ] && ok "mosquitto/$V/retained-cleared" || ko "mosquitto/$V/retained-cleared" "got '$got'"

  # Will: a subscriber on the will topic; a client with a will is killed (no DISCONNECT).
  t="rc/will/$V/$$"
  timeout 6 mosquitto_sub -h "$HOST" -p "$PORT" -V $V -t "$t" -C 1 -q 1 -i "rcw-s-$V" >"$tmp/will.$V" & s=$!
  sleep 0.5
  mosquitto_sub -h "$HOST" -p "$PORT" -V $V -t "rc/idle/$V" -i "rcw-c-$V" -k 60 \
    --will-topic "$t" --will-payload "bye-$V" --will-qos 1 >/dev/null & c=$!
  sleep 0.5; { kill -9 $c; wait $c; } 2>/dev/null
  wait $s
  [ "$(cat "$tmp/will.$V")" = "bye-$V" ] && ok "mosquitto/$V/will" || ko "mosquitto/$V/will" "got '$(cat "$tmp/will.$V")'"

  # Persistent session: subscribe with clean session off, go away, messages published
  # meanwhile arrive at the next connection.
  t="rc/persist/$V/$$"; id="rcp-$V-$$"
  extra=""; [ $V = mqttv5 ] && extra="-x 60"
  timeout 3 mosquitto_sub -h "$HOST" -p "$PORT" -V $V -t "$t" -q 1 -c -i "$id" $extra -W 1 >/dev/null 2>&1
  for i in 1 2 3; do mosquitto_pub -h "$HOST" -p "$PORT" -V $V -t "$t" -q 1 -m "m$i"; done
  timeout 5 mosquitto_sub -h "$HOST" -p "$PORT" -V $V -t "$t" -q 1 -c -i "$id" $extra -C 3 >"$tmp/p.$V"
  got=$(tr '\n' ' ' <"$tmp/p.$V")
  [ "$got" = "m1 m2 m3 " ] && ok "mosquitto/$V/persistent-session" || ko "mosquitto/$V/persistent-session" "got '$got'"
done

if $PY -c 'import paho.mqtt' 2>/dev/null; then
  $PY - "$HOST" "$PORT" >"$tmp/py.out" 2>&1 <<'PYEOF'
import sys, time, threading
import paho.mqtt.client as mqtt
host, port = sys.argv[1], int(sys.argv[2])
def client(cid, proto, clean=True, **kw):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=proto,
                    **({} if proto == mqtt.MQTTv5 else {"clean_session": clean}))
    return c
def run(name, proto):
    got = []
    ev = threading.Event()
    s = client(f"py-s-{name}", proto)
    def on_msg(c, u, m):
        got.append((m.topic, m.payload)); ev.set()
    s.on_message = on_msg
    s.connect(host, port); s.loop_start()
    s.subscribe("py/will/" + name, 1); time.sleep(0.3)
    w = client(f"py-w-{name}", proto)
    w.will_set("py/will/" + name, b"gone", 1)
    w.connect(host, port); w.loop_start(); time.sleep(0.3)
    w._sock.close()  # ungraceful
    ok = ev.wait(5) and got[0] == ("py/will/" + name, b"gone")
    print(("PASS" if ok else "FAIL") + f" paho-py/{name}/will" + ("" if ok else f": {got}"))
    # persistent session
    cid = f"py-p-{name}"
    props = None
    if proto == mqtt.MQTTv5:
        from paho.mqtt.properties import Properties
        from paho.mqtt.packettypes import PacketTypes
        props = Properties(PacketTypes.CONNECT); props.SessionExpiryInterval = 60
    p = client(cid, proto, clean=False)
    p.connect(host, port, **({"clean_start": False, "properties": props} if proto == mqtt.MQTTv5 else {}))
    p.loop_start(); p.subscribe("py/persist/" + name, 2); time.sleep(0.3)
    p.disconnect(); p.loop_stop()
    q = client(f"py-q-{name}", proto); q.connect(host, port); q.loop_start()
    q.publish("py/persist/" + name, b"queued", 2).wait_for_publish(5); q.disconnect(); q.loop_stop()
    got2 = []; ev2 = threading.Event()
    p = client(cid, proto, clean=False)
    p.on_message = lambda c, u, m: (got2.append(m.payload), ev2.set())
    p.connect(host, port, **({"clean_start": False, "properties": props} if proto == mqtt.MQTTv5 else {}))
    p.loop_start()
    ok = ev2.wait(5) and got2 == [b"queued"]
    print(("PASS" if ok else "FAIL") + f" paho-py/{name}/persistent-session" + ("" if ok else f": {got2}"))
    p.disconnect(); s.disconnect()
def qos(name, proto):
    for q in (0, 1, 2):
        got = []; ev = threading.Event()
        s = client(f"py-qs-{name}-{q}", proto)
        s.on_message = lambda c, u, m: (got.append((m.payload, m.qos)), ev.set())
        s.connect(host, port); s.loop_start(); s.subscribe(f"py/qos/{name}/{q}", q); time.sleep(0.3)
        p = client(f"py-qp-{name}-{q}", proto); p.connect(host, port); p.loop_start()
        p.publish(f"py/qos/{name}/{q}", b"hi", q).wait_for_publish(5)
        ok = ev.wait(5) and got == [(b"hi", q)]
        print(("PASS" if ok else "FAIL") + f" paho-py/{name}/qos{q}" + ("" if ok else f": {got}"))
        p.disconnect(); s.disconnect(); p.loop_stop(); s.loop_stop()
    got = []; ev = threading.Event()
    p = client(f"py-rp-{name}", proto); p.connect(host, port); p.loop_start()
    p.publish(f"py/retain/{name}", b"kept", 1, retain=True).wait_for_publish(5)
    s = client(f"py-rs-{name}", proto)
    s.on_message = lambda c, u, m: (got.append((m.payload, m.retain)), ev.set())
    s.connect(host, port); s.loop_start(); s.subscribe(f"py/retain/{name}", 1)
    ok = ev.wait(5) and got == [(b"kept", True)]
    print(("PASS" if ok else "FAIL") + f" paho-py/{name}/retained" + ("" if ok else f": {got}"))
    p.publish(f"py/retain/{name}", b"", 1, retain=True).wait_for_publish(5)
    p.disconnect(); s.disconnect(); p.loop_stop(); s.loop_stop()
qos("v311", mqtt.MQTTv311)
qos("v5", mqtt.MQTTv5)
run("v311", mqtt.MQTTv311)
run("v5", mqtt.MQTTv5)
PYEOF
  cat "$tmp/py.out"
  pass=$((pass + $(grep -c '^PASS' "$tmp/py.out")))
  fail=$((fail + $(grep -c '^FAIL' "$tmp/py.out")))
  grep -q '^PASS' "$tmp/py.out" || { echo "FAIL paho-py: no result"; fail=$((fail+1)); }
else
  echo "SKIP paho-py (python3 -c 'import paho.mqtt' failed)"
fi
js_dir="$(dirname "$0")/../tests/js"
if command -v node >/dev/null 2>&1 && [ -d "$js_dir/node_modules/mqtt" ]; then
  timeout 60 node "$js_dir/interop.js" "$HOST" "$PORT" >"$tmp/js.out" 2>&1
  cat "$tmp/js.out"
  pass=$((pass + $(grep -c '^PASS' "$tmp/js.out")))
  fail=$((fail + $(grep -c '^FAIL' "$tmp/js.out")))
  grep -q '^PASS' "$tmp/js.out" || { echo "FAIL mqttjs: no result"; fail=$((fail+1)); }
else
  echo "SKIP mqttjs (node or $js_dir/node_modules missing: npm ci there)"
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
