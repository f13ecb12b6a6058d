// QoS 0/1/2 round trips through the broker with MQTT.js (node).
//
// One client subscribes at QoS 2 and publishes one message at each QoS to itself; each must
// come back with the QoS it was sent at. Prints one line per round trip; exit status 0 when
// all three completed, 1 otherwise.
//
//     node roundtrip.js ws://127.0.0.1:8080/mqtt
'use strict';

const mqtt = require('mqtt');

const url = process.argv[2];
const tag = Math.random().toString(16).slice(2, 10);
const topic = `mqttjs/${tag}`;
const fail = (msg) => {
  console.error(`mqtt.js: ${msg}`);
  process.exit(1);
};
setTimeout(() => fail('not done within 20s'), 20000).unref();

const client = mqtt.connect(url, { clientId: `mqttjs-${tag}`, reconnectPeriod: 0 });
client.on('error', (e) => fail(`error: ${e.message}`));

const waiting = [];
client.on('message', (t, payload, packet) => {
  const next = waiting.shift();
  if (next) next({ t, payload: payload.toString(), qos: packet.qos });
});
const nextMessage = () => new Promise((resolve) => waiting.push(resolve));

client.on('connect', async () => {
  try {
    const granted = await client.subscribeAsync(topic, { qos: 2 });
    if (granted[0].qos !== 2) fail(`SUBACK granted ${JSON.stringify(granted)}`);
    for (const qos of [0, 1, 2]) {
      const payload = `mqtt.js qos ${qos}`;
      const received = nextMessage();
      await client.publishAsync(topic, payload, { qos });
      const m = await received;
      if (m.t !== topic || m.payload !== payload || m.qos !== qos) {
        fail(`got ${JSON.stringify(m)}, sent ${JSON.stringify({ topic, payload, qos })}`);
      }
      console.log(`mqtt.js qos ${qos} round trip ok`);
    }
    await client.endAsync();
    process.exit(0);
  } catch (e) {
    fail(e.message);
  }
});
