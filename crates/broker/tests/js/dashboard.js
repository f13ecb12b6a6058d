// Drives the broker's web dashboard in headless Chromium (puppeteer-core over the DevTools
// protocol) for crates/starling/tests/dashboard.rs. It reports what the page showed as one
// JSON line per step on stdout and waits for a line on stdin where the test must act (an
// MQTT burst); the assertions are the test's, so a broken page shows up there.
//
//   node dashboard.js <page url> <token> <screenshot dir> <chromium>
'use strict';

const path = require('node:path');
const readline = require('node:readline');
const puppeteer = require('puppeteer-core');

const [url, token, shots, chromium] = process.argv.slice(2);
const WAIT = { timeout: 15000 };

const say = (event, data = {}) => process.stdout.write(JSON.stringify({ event, ...data }) + '\n');

// Lines from the test, kept until asked for: one may come before the script waits for it.
const input = [];
const waiting = [];
readline.createInterface({ input: process.stdin }).on('line', (l) => {
  const w = waiting.shift();
  if (w) w(l);
  else input.push(l);
});
const fromTest = () => (input.length ? Promise.resolve(input.shift()) : new Promise((r) => waiting.push(r)));

// What the page did wrong: console errors and warnings, uncaught exceptions, requests that
// did not complete and answers of 400 or more.
let seen;
const resetSeen = () => {
  seen = { console: [], page_errors: [], failed: [], bad_status: [] };
};
resetSeen();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let step = 'launch';

async function main() {
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    defaultViewport: { width: 1280, height: 860 },
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  try {
    await drive(await browser.newPage());
  } finally {
    await browser.close();
  }
}

async function drive(page) {
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warn') {
      seen.console.push(`${m.type()}: ${m.text()} [${m.location().url || ''}]`);
    }
  });
  page.on('pageerror', (e) => seen.page_errors.push(String(e && e.message ? e.message : e)));
  page.on('requestfailed', (r) => seen.failed.push(`${r.method()} ${r.url()}: ${r.failure() && r.failure().errorText}`));
  page.on('response', (r) => {
    if (r.status() >= 400) seen.bad_status.push(`${r.status()} ${r.request().method()} ${r.url()}`);
  });

  const attr = (sel, name) => page.$eval(sel, (el, n) => el.getAttribute(n), name);
  const loads = async (view) => Number(await attr(`#view-${view}`, 'data-loads'));
  // Waits for the view's next successful load after `before`.
  const loadedAfter = (view, before) =>
    page.waitForFunction((v, b) => Number(document.querySelector(`#view-${v}`).dataset.loads) > b, WAIT, view, before);
  const rows = (table) =>
    page.$$eval(`#${table} tbody tr`, (trs) =>
      trs.filter((tr) => !tr.querySelector('td.empty')).map((tr) => Array.from(tr.cells, (td) => td.textContent.trim())),
    );
  const open = async (view) => {
    const before = await loads(view);
    await page.click(`nav a[data-view=${view}]`);
    await loadedAfter(view, before);
  };
  const shoot = (name) => page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: true });

  // 1. No token yet: the API says 401 and the page asks for one.
  step = 'token';
  await page.goto(url, { waitUntil: 'load' });
  await page.waitForSelector('#token-form input[name=token]', { ...WAIT, visible: true });
  await shoot('token');
  say('token_asked', seen);
  resetSeen();
  await page.type('#token-form input[name=token]', token);
  await page.click('#token-form button[type=submit]');
  await page.waitForFunction(() => Number(document.querySelector('#view-overview').dataset.loads) > 0, WAIT);

  // 2. A new load of the page keeps the token (session storage) and does not ask again.
  step = 'reload';
  await page.reload({ waitUntil: 'load' });
  await page.waitForFunction(() => Number(document.querySelector('#view-overview').dataset.loads) > 0, WAIT);
  say('reloaded', { dialog_hidden: await page.$eval('#token-dialog', (d) => d.hidden) });

  // 3. The rate chart at rest, then while the test publishes a burst.
  step = 'idle';
  const chart = () =>
    page.$eval('#rate-chart', (c) => ({
      samples: Number(c.dataset.samples),
      received: Number(c.getAttribute('data-last-received')),
      sent: Number(c.getAttribute('data-last-sent')),
      dropped: Number(c.getAttribute('data-last-dropped')),
    }));
  await page.waitForFunction(
    () => {
      const c = document.querySelector('#rate-chart');
      return (
        Number(c.dataset.samples) >= 3 &&
        c.getAttribute('data-last-received') === '0' &&
        c.getAttribute('data-last-sent') === '0'
      );
    },
    { timeout: 30000 },
  );
  say('idle', await chart());
  step = 'burst';
  await fromTest();
  // The test decides whether the chart moved; this only watches for a while.
  let peak = await chart();
  for (const deadline = Date.now() + 10000; Date.now() < deadline && !(peak.received > 0 && peak.sent > 0); ) {
    await sleep(100);
    const now = await chart();
    peak = {
      samples: now.samples,
      received: Math.max(peak.received, now.received),
      sent: Math.max(peak.sent, now.sent),
      dropped: Math.max(peak.dropped, now.dropped),
    };
  }
  say('burst', peak);
  await sleep(1500); // the spike a little way into the chart, for the person looking
  await shoot('overview');
  say('overview', {
    connections: await page.$eval('#stat-connections', (e) => e.textContent),
    nodes: await rows('nodes-table'),
  });

  // 4. Clients: listed, then searched.
  step = 'clients';
  await open('clients');
  await page.waitForSelector('#clients-table tr[data-clientid="dash-watcher"]', WAIT);
  const listed = await rows('clients-table');
  await shoot('clients');
  const search = async (like) => {
    await page.$eval('#client-search input[name=_like_clientid]', (el, v) => (el.value = v), like);
    const before = await loads('clients');
    await page.click('#client-search button[type=submit]');
    await loadedAfter('clients', before);
    return rows('clients-table');
  };
  say('clients', { listed, none: await search('no-such-client'), matched: await search('dash-w') });
  await search('');

  // 5. Subscriptions.
  step = 'subscriptions';
  await open('subscriptions');
  await page.waitForSelector('#subs-table tr[data-topic="dash/#"]', WAIT);
  await shoot('subscriptions');
  say('subscriptions', { listed: await rows('subs-table') });

  // 6. Retained messages: listed, one deleted.
  step = 'retained';
  await open('retained');
  await page.waitForSelector('#retained-table tr[data-topic="dash/retained/one"]', WAIT);
  const before = await rows('retained-table');
  await shoot('retained');
  {
    const n = await loads('retained');
    const del = '#retained-table tr[data-topic="dash/retained/one"] button';
    await page.click(del);
    await page.waitForSelector(`${del}.armed`, WAIT);
    await page.click(del);
    await loadedAfter('retained', n);
  }
  say('retained', { before, after: await rows('retained-table') });

  // 7. The publish form.
  step = 'publish';
  await open('publish');
  await page.type('#publish-form input[name=topic]', 'dash/form');
  await page.type('#publish-form textarea[name=payload]', 'from the dashboard');
  await page.select('#publish-form select[name=qos]', '1');
  await page.type('#publish-form textarea[name=user_properties]', 'source=dashboard');
  await page.click('#publish-form button[type=submit]');
  await page.waitForSelector('#publish-result.ok, #publish-result.bad', WAIT);
  await shoot('publish');
  say('published', { result: await page.$eval('#publish-result', (e) => `${e.className}: ${e.textContent}`) });

  // 8. Kick the watcher from its row.
  step = 'kick';
  await open('clients');
  const kick = '#clients-table tr[data-clientid="dash-watcher"] button';
  await page.waitForSelector(kick, WAIT);
  {
    const n = await loads('clients');
    await page.click(kick);
    await page.waitForSelector(`${kick}.armed`, WAIT);
    await page.click(kick);
    await loadedAfter('clients', n);
  }
  say('kicked', { listed: await rows('clients-table'), banner: await page.$eval('#banner', (e) => e.textContent) });

  await sleep(1200); // one more poll of the overview's counters, still without an error
  step = 'done';
  say('done', seen);
}

main().then(
  () => process.exit(0),
  (e) => {
    say('fail', { step, error: String(e && e.stack ? e.stack : e) });
    process.exit(1);
  },
);
