"""Publishes COUNT QoS 1 and COUNT QoS 2 messages, interleaved, to TOPIC with paho-mqtt 2.x,
and prints `acked PAYLOAD` for each one the broker acknowledged with success (PUBACK, or
PUBCOMP for QoS 2), as it happens. Payloads are `1:N` and `2:N`. Stops at the first
disconnection (the broker was killed): what it printed is what it saw acknowledged.

    python3 publish_acked.py --port 1883 --topic k/data --count 10000 [--retain]
"""

import argparse
import sys
import threading

import paho.mqtt.client as mqtt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--retain", action="store_true", help="publish with RETAIN set")
    ap.add_argument(
        "--pad",
        type=int,
        default=0,
        help="bytes of padding after each payload, behind a `|` (printed without it)",
    )
    args = ap.parse_args()

    if not hasattr(mqtt, "CallbackAPIVersion"):
        sys.exit("paho-mqtt 2.x is needed")
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id="kill-test-publisher",
        protocol=mqtt.MQTTv5,
    )
    client.max_inflight_messages_set(args.inflight)
    client.max_queued_messages_set(0)
    payloads = {}
    state = {"done": 0}
    over = threading.Event()

    def on_connect(c, userdata, flags, reason_code, properties):
        if reason_code.is_failure:
            # sys.exit in a callback would end only paho's thread, leaving main waiting.
            print(f"refused {reason_code}", flush=True)
            over.set()
            return
        for n in range(args.count):
            for qos in (1, 2):
                payload = f"{qos}:{n}"
                body = payload + ("|" + "x" * args.pad if args.pad else "")
                info = c.publish(args.topic, body, qos=qos, retain=args.retain)
                payloads[info.mid] = payload

    def on_publish(c, userdata, mid, reason_code, properties):
        if not reason_code.is_failure:
            print(f"acked {payloads.get(mid, '?')}", flush=True)
        state["done"] += 1
        if state["done"] == 2 * args.count:
            print("all acked", flush=True)
            over.set()

    def on_disconnect(c, userdata, flags, reason_code, properties):
        print(f"disconnected {reason_code}", flush=True)
        over.set()

    client.on_connect = on_connect
    client.on_publish = on_publish
    client.on_disconnect = on_disconnect
    client.connect(args.host, args.port, keepalive=30)
    client.loop_start()
    over.wait()
    # Stopped before the broker comes back: nothing is published after the kill.
    client.loop_stop()


if __name__ == "__main__":
    main()
