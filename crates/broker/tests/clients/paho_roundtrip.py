"""QoS 0/1/2 round trips through the broker with Python paho-mqtt (1.x or 2.x).

One client subscribes at QoS 2 and publishes one message at each QoS to itself; each must
come back with the QoS it was sent at. Prints one line per round trip; exit status 0 when
all three completed, 1 otherwise.

    python3 paho_roundtrip.py --port 8080 --transport websockets [--path /mqtt] [--cafile ca.pem]
"""

import argparse
import queue
import sys
import uuid

import paho.mqtt.client as mqtt

WAIT_SECS = 10


def make_client(client_id, transport):
    # paho-mqtt 2.x asks which callback signatures we use; 1.x has no such argument.
    if hasattr(mqtt, "CallbackAPIVersion"):
        return mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION1, client_id=client_id, transport=transport
        )
    return mqtt.Client(client_id=client_id, transport=transport)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--transport", default="tcp", choices=["tcp", "websockets"])
    ap.add_argument("--path", default="/mqtt")
    ap.add_argument("--cafile")
    args = ap.parse_args()

    tag = uuid.uuid4().hex[:8]
    topic = f"paho/{tag}"
    events = queue.Queue()
    client = make_client(f"paho-{tag}", args.transport)
    if args.transport == "websockets":
        client.ws_set_options(path=args.path)
    if args.cafile:
        client.tls_set(ca_certs=args.cafile)
    client.on_connect = lambda c, u, f, rc: events.put(("connack", rc))
    client.on_subscribe = lambda c, u, mid, granted: events.put(("suback", granted))
    client.on_message = lambda c, u, m: events.put(("message", (m.topic, m.payload, m.qos)))

    def expect(kind):
        try:
            got, value = events.get(timeout=WAIT_SECS)
        except queue.Empty:
            sys.exit(f"paho: no {kind} within {WAIT_SECS}s")
        if got != kind:
            sys.exit(f"paho: expected {kind}, got {got} {value!r}")
        return value

    client.connect(args.host, args.port, keepalive=30)
    client.loop_start()
    rc = expect("connack")
    if rc != 0:
        sys.exit(f"paho: CONNACK refused: {rc}")
    client.subscribe(topic, qos=2)
    granted = expect("suback")
    if list(granted) != [2]:
        sys.exit(f"paho: SUBACK granted {granted!r}, expected [2]")
    for qos in (0, 1, 2):
        payload = f"paho qos {qos} over {args.transport}".encode()
        info = client.publish(topic, payload, qos=qos)
        info.wait_for_publish(timeout=WAIT_SECS)
        if not info.is_published():
            sys.exit(f"paho: QoS {qos} publish not acknowledged")
        got_topic, got_payload, got_qos = expect("message")
        if (got_topic, got_payload, got_qos) != (topic, payload, qos):
            sys.exit(f"paho: got {(got_topic, got_payload, got_qos)!r}, sent {(topic, payload, qos)!r}")
        print(f"paho qos {qos} round trip ok", flush=True)
    client.disconnect()
    client.loop_stop()


if __name__ == "__main__":
    main()
