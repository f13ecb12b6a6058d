"""An MQTT 5 subscriber with paho-mqtt 2.x that reports what happens to it, a line each:
`subscribed` once its SUBACK came, `msg TOPIC PAYLOAD` per message, and
`disconnected CODE` (the reason code's value, e.g. 152 for 0x98 Administrative action;
followed by ` ref=ADDRESS` when the DISCONNECT names a Server Reference) when the broker
ends the connection, after which it exits; `refused CODE` (with ` ref=ADDRESS` likewise)
when its CONNACK refuses it.

    python3 watch_v5.py --port 1883 --id watcher --topic 'api/#' [--expiry 3600]
        [--delay-ms 1 --receive-max 4 --no-ack] [--unsubscribe-after 200]

With `--unsubscribe-after N` it unsubscribes after its Nth message, says `unsubscribed`
at the UNSUBACK, and goes on printing what still comes.
"""

import argparse
import sys
import threading
import time

import paho.mqtt.client as mqtt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--id", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument(
        "--expiry",
        type=int,
        default=0,
        help="session expiry interval; above 0 the session is resumed (clean start 0)",
    )
    ap.add_argument(
        "--delay-ms",
        type=float,
        default=0,
        help="time taken over each message, in paho's network thread: a slow reader",
    )
    ap.add_argument(
        "--receive-max",
        type=int,
        default=0,
        help="MQTT 5 Receive Maximum: QoS 1/2 messages the broker may have unacknowledged",
    )
    ap.add_argument(
        "--no-ack",
        action="store_true",
        help="never acknowledge a QoS 1/2 message: they stay in flight at the broker",
    )
    ap.add_argument(
        "--will-topic",
        default="",
        help="a will (QoS 1, payload `gone ID`, no delay) on this topic",
    )
    ap.add_argument(
        "--head",
        action="store_true",
        help="print each payload up to its first `|` (publish_acked.py --pad)",
    )
    ap.add_argument(
        "--codes",
        action="store_true",
        help="print the SUBACK's reason code on its line: `subscribed 1`, `subscribed 151`",
    )
    ap.add_argument(
        "--unsubscribe-after",
        type=int,
        default=0,
        help="unsubscribe after this many messages, and go on reading",
    )
    args = ap.parse_args()

    if not hasattr(mqtt, "CallbackAPIVersion"):
        sys.exit("paho-mqtt 2.x is needed")
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=args.id,
        protocol=mqtt.MQTTv5,
        manual_ack=args.no_ack,
    )
    over = threading.Event()

    def say(line):
        print(line, flush=True)

    def on_connect(c, userdata, flags, reason_code, properties):
        if reason_code.is_failure:
            ref = getattr(properties, "ServerReference", None) if properties else None
            say(f"refused {reason_code.value}" + (f" ref={ref}" if ref else ""))
            over.set()
            return
        c.subscribe(args.topic, qos=1)

    def on_subscribe(c, userdata, mid, reason_codes, properties):
        if args.codes:
            say("subscribed " + " ".join(str(rc.value) for rc in reason_codes))
        else:
            say("subscribed")

    got = [0]

    def on_message(c, userdata, msg):
        payload = msg.payload.decode("utf-8", "replace")
        if args.head:
            payload = payload.split("|", 1)[0]
        say(f"msg {msg.topic} {payload}")
        got[0] += 1
        if got[0] == args.unsubscribe_after:
            c.unsubscribe(args.topic)
        if args.delay_ms > 0:
            time.sleep(args.delay_ms / 1000)

    def on_disconnect(c, userdata, flags, reason_code, properties):
        ref = getattr(properties, "ServerReference", None) if properties else None
        say(f"disconnected {reason_code.value}" + (f" ref={ref}" if ref else ""))
        over.set()

    def on_unsubscribe(c, userdata, mid, reason_codes, properties):
        say("unsubscribed")

    client.on_connect = on_connect
    client.on_unsubscribe = on_unsubscribe
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    client.on_disconnect = on_disconnect
    props = None
    if args.expiry > 0 or args.receive_max > 0:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.CONNECT)
        if args.expiry > 0:
            props.SessionExpiryInterval = args.expiry
        if args.receive_max > 0:
            props.ReceiveMaximum = args.receive_max
    if args.will_topic:
        client.will_set(args.will_topic, f"gone {args.id}", qos=1)
    client.connect(
        args.host,
        args.port,
        keepalive=30,
        clean_start=args.expiry == 0,
        properties=props,
    )
    client.loop_start()
    over.wait(120)
    client.loop_stop()


if __name__ == "__main__":
    main()
