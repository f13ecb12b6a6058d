// MQTT.js over TCP against a running broker: QoS 0/1/2, retained, will, persistent session,
// for MQTT 3.1.1 and 5.0. Prints PASS/FAIL lines; used by scripts/real-clients.sh.
//   node interop.js HOST PORT
const mqtt = require("mqtt");
const [host, port] = process.argv.slice(2);
const url = `mqtt://${host}:${port}`;
const tag = `${process.pid}`;

function connect(opts) {
  return new Promise((resolve, reject) => {
    const c = mqtt.connect(url, { reconnectPeriod: 0, connectTimeout: 5000, ...opts });
    c.once("connect", (ack) => resolve([c, ack]));
    c.once("error", reject);
  });
}
const wait = (ms) => new Promise((r) => setTimeout(r, ms));
function nextMessage(c, ms = 5000) {
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(null), ms);
    c.once("message", (topic, payload, packet) => {
      clearTimeout(t);
      resolve({ topic, payload: payload.toString(), packet });
    });
  });
}
function report(ok, name, why) {
  console.log(`${ok ? "PASS" : "FAIL"} mqttjs/${name}${ok ? "" : `: ${why}`}`);
}

async function run(v) {
  const name = v === 5 ? "v5" : "v311";
  for (const qos of [0, 1, 2]) {
    const t = `js/qos/${name}/${qos}/${tag}`;
    const [s] = await connect({ protocolVersion: v, clientId: `js-s-${name}-${qos}-${tag}` });
    await s.subscribeAsync(t, { qos });
    const [p] = await connect({ protocolVersion: v, clientId: `js-p-${name}-${qos}-${tag}` });
    const got = nextMessage(s);
    await p.publishAsync(t, "hi", { qos });
    const m = await got;
    report(m && m.payload === "hi" && m.packet.qos === qos, `${name}/qos${qos}`, JSON.stringify(m && m.payload));
    await p.endAsync();
    await s.endAsync();
  }
  {
    const t = `js/retain/${name}/${tag}`;
    const [p] = await connect({ protocolVersion: v, clientId: `js-rp-${name}-${tag}` });
    await p.publishAsync(t, "kept", { qos: 1, retain: true });
    const [s] = await connect({ protocolVersion: v, clientId: `js-rs-${name}-${tag}` });
    const got = nextMessage(s);
    await s.subscribeAsync(t, { qos: 1 });
    const m = await got;
    report(m && m.payload === "kept" && m.packet.retain, `${name}/retained`, JSON.stringify(m && m.payload));
    await p.publishAsync(t, "", { qos: 1, retain: true });
    await p.endAsync();
    await s.endAsync();
  }
  {
    const t = `js/will/${name}/${tag}`;
    const [s] = await connect({ protocolVersion: v, clientId: `js-ws-${name}-${tag}` });
    await s.subscribeAsync(t, { qos: 1 });
    const [w] = await connect({
      protocolVersion: v,
      clientId: `js-ww-${name}-${tag}`,
      will: { topic: t, payload: Buffer.from("gone"), qos: 1, retain: false },
    });
    const got = nextMessage(s);
    w.stream.destroy(); // no DISCONNECT: the will must be published
    const m = await got;
    report(m && m.payload === "gone", `${name}/will`, JSON.stringify(m && m.payload));
    w.end(true);
    await s.endAsync();
  }
  {
    const t = `js/persist/${name}/${tag}`;
    const id = `js-pp-${name}-${tag}`;
    const persist = v === 5
      ? { clean: false, properties: { sessionExpiryInterval: 60 } }
      : { clean: false };
    const [a] = await connect({ protocolVersion: v, clientId: id, ...persist });
    await a.subscribeAsync(t, { qos: 1 });
    await a.endAsync();
    const [p] = await connect({ protocolVersion: v, clientId: `js-pq-${name}-${tag}` });
    await p.publishAsync(t, "queued", { qos: 1 });
    await p.endAsync();
    const [b, ack] = await new Promise((resolve, reject) => {
      const c = mqtt.connect(url, { reconnectPeriod: 0, protocolVersion: v, clientId: id, ...persist });
      const got = nextMessage(c);
      c.once("connect", async (ack) => resolve([c, ack, await got]));
      c.once("error", reject);
    }).then(async ([c, ack, m]) => {
      report(ack.sessionPresent && m && m.payload === "queued", `${name}/persistent-session`,
        `sessionPresent=${ack.sessionPresent} got=${JSON.stringify(m && m.payload)}`);
      return [c, ack];
    });
    void ack;
    await b.endAsync();
  }
}

(async () => {
  try {
    await run(4);
    await run(5);
  } catch (e) {
    console.log(`FAIL mqttjs/error: ${e}`);
  }
  await wait(100);
  process.exit(0);
})();
