// The dashboard: views over /api/v1 (docs/http-api.md), switched by the URL's #fragment.
// Everything shown that a client chose (ids, topics, payloads) goes in as text, never as
// markup: the page's CSP would stop a script, but a row must not be able to restyle it.
'use strict';

(() => {
  const TOKEN_KEY = 'starling.api-token';
  const POLL_MS = 1000;
  const HISTORY = 121; // samples kept: two minutes at one a second, ends included
  const VIEWS = ['overview', 'clients', 'subscriptions', 'retained', 'publish'];
  const plot = window.StarlingPlot;

  const $ = (sel) => document.querySelector(sel);

  // ---------------------------------------------------------------------------------
  // The API, with the token.

  class Unauthorized extends Error {}
  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  let waitingForToken = false;

  async function api(method, path, body) {
    const headers = {};
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = 'Bearer ' + token;
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const res = await fetch('/api/v1' + path, init);
    const text = await res.text();
    if (res.status === 401) {
      askToken(token ? 'That token was refused.' : '');
      throw new Unauthorized('token needed');
    }
    if (!res.ok) {
      let message = text;
      try {
        message = JSON.parse(text).message || text;
      } catch (_) {
        // not JSON: the text is the message
      }
      throw new ApiError(res.status, `${res.status}: ${message}`);
    }
    const type = res.headers.get('Content-Type') || '';
    return type.includes('json') ? JSON.parse(text) : text;
  }

  function askToken(reason) {
    waitingForToken = true;
    $('#token-reason').textContent = reason;
    $('#token-dialog').hidden = false;
    $('#poll-state').textContent = 'token needed';
    $('#token-form input[name=token]').focus();
  }

  $('#token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const input = $('#token-form input[name=token]');
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    input.value = '';
    $('#token-dialog').hidden = true;
    $('#forget-token').hidden = false;
    waitingForToken = false;
    hideBanner();
    show(currentView());
  });

  $('#forget-token').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $('#forget-token').hidden = true;
    location.reload();
  });
  $('#forget-token').hidden = !sessionStorage.getItem(TOKEN_KEY);

  // A failure the person should see; a missing token already shows its own dialog.
  function failed(e) {
    if (e instanceof Unauthorized) return;
    showBanner(e instanceof ApiError ? e.message : `The broker did not answer (${e.message}).`, 'error');
  }

  let bannerTimer = null;
  function showBanner(text, kind) {
    const b = $('#banner');
    b.textContent = text;
    b.className = 'banner ' + kind;
    b.hidden = false;
    clearTimeout(bannerTimer);
    if (kind === 'info') bannerTimer = setTimeout(hideBanner, 4000);
  }
  function hideBanner() {
    $('#banner').hidden = true;
  }

  // ---------------------------------------------------------------------------------
  // Small DOM helpers.

  function cell(text, cls) {
    const td = document.createElement('td');
    td.textContent = text === null || text === undefined ? '' : String(text);
    if (cls) td.className = cls;
    return td;
  }

  function fill(tbody, rows, emptyText, columns) {
    tbody.replaceChildren(...rows);
    if (rows.length === 0) {
      const tr = document.createElement('tr');
      const td = cell(emptyText, 'empty');
      td.colSpan = columns;
      tr.append(td);
      tbody.append(tr);
    }
  }

  // The form's non-empty fields as query parameters.
  function query(form) {
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (String(v).trim() !== '') q.set(k, String(v).trim());
    return q;
  }

  // A button that acts on the second click within a few seconds: no native dialog, and no
  // client kicked or message deleted by one stray click.
  function twoStep(label, armedLabel, action) {
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'danger';
    b.textContent = label;
    let timer = null;
    b.addEventListener('click', async () => {
      if (!b.classList.contains('armed')) {
        b.classList.add('armed');
        b.textContent = armedLabel;
        timer = setTimeout(() => {
          b.classList.remove('armed');
          b.textContent = label;
        }, 4000);
        return;
      }
      clearTimeout(timer);
      b.disabled = true;
      try {
        await action();
      } catch (e) {
        failed(e);
        b.disabled = false;
      }
    });
    return b;
  }

  function loaded(view) {
    const s = $('#view-' + view);
    s.dataset.loads = String(Number(s.dataset.loads) + 1);
  }

  // ---------------------------------------------------------------------------------
  // Overview: polled all the time, so the charts have history when the view is opened.

  const history = { at: [], received: [], sent: [], dropped: [], connections: [] };
  let previous = null; // the last counters and when they were read

  function sumMetrics(list) {
    const t = { received: 0, sent: 0, dropped: 0 };
    for (const node of list) {
      const m = node.metrics || {};
      t.received += m['messages.received'] || 0;
      t.sent += m['messages.sent'] || 0;
      for (const [k, v] of Object.entries(m)) if (k.startsWith('dropped.')) t.dropped += v;
    }
    return t;
  }

  function push(key, v) {
    const a = history[key];
    a.push(v);
    if (a.length > HISTORY) a.shift();
  }

  async function sample() {
    const [metrics, stats, nodes] = await Promise.all([
      api('GET', '/metrics'),
      api('GET', '/stats'),
      api('GET', '/nodes'),
    ]);
    const now = performance.now();
    const totals = sumMetrics(metrics);
    if (previous) {
      const dt = (now - previous.at) / 1000;
      // A counter that went down means the node restarted: count from its new value.
      const rate = (k) => (totals[k] >= previous.totals[k] && dt > 0 ? (totals[k] - previous.totals[k]) / dt : 0);
      push('received', round(rate('received')));
      push('sent', round(rate('sent')));
      push('dropped', round(rate('dropped')));
    }
    previous = { at: now, totals };

    const sum = (key) => stats.reduce((acc, n) => acc + ((n.stats || {})[key] || 0), 0);
    push('connections', sum('connections.count'));
    $('#stat-connections').textContent = plot.fmt(sum('connections.count'));
    $('#stat-sessions').textContent = plot.fmt(sum('sessions.count'));
    $('#stat-subscriptions').textContent = plot.fmt(sum('subscriptions.count'));
    $('#stat-retained').textContent = plot.fmt(sum('retaineds.count'));
    $('#stat-queued').textContent = plot.fmt(sum('message_queues.count'));
    $('#stat-inflight').textContent = plot.fmt(sum('out_inflights.count') + sum('in_inflights.count'));
    $('#stat-uptime').textContent = nodes.length ? nodes[0].uptime : '–';
    renderNodes(nodes);
    drawCharts();
    $('#poll-state').textContent = 'live · ' + new Date().toLocaleTimeString();
    $('#poll-state').classList.remove('stale');
    loaded('overview');
  }

  function round(v) {
    return Math.round(v * 10) / 10;
  }

  function renderNodes(nodes) {
    const rows = nodes.map((n) => {
      const tr = document.createElement('tr');
      const load = n.load1 === undefined ? '–' : [n.load1, n.load5, n.load15].map((v) => v.toFixed(2)).join(' / ');
      const mem =
        n.memory_total === undefined ? '–' : `${bytes(n.memory_used)} of ${bytes(n.memory_total)}`;
      tr.append(
        cell(n.node_id),
        cell(n.node_name),
        cell(n.version),
        cell(n.uptime),
        cell(n.connections, 'num'),
        cell(load),
        cell(mem),
      );
      return tr;
    });
    fill($('#nodes-table tbody'), rows, 'no node answered', 7);
  }

  function bytes(n) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    let v = n;
    while (v >= 1024 && i < units.length - 1) {
      v /= 1024;
      i++;
    }
    return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
  }

  // Drawn in this order: received wide and sent narrow over it, so that when every message
  // received is sent once (one subscriber each) both lines still show.
  const RATE_SERIES = [
    { key: 'dropped', label: 'dropped', color: '#dc2626', width: 2 },
    { key: 'received', label: 'received', color: '#2563eb', width: 4 },
    { key: 'sent', label: 'sent', color: '#16a34a', width: 1.5 },
  ];

  function legend(el, series, unit) {
    el.replaceChildren(
      ...series.map((s) => {
        const span = document.createElement('span');
        const dot = document.createElement('i');
        dot.className = 'dot dot-' + s.key;
        const last = s.values.length ? s.values[s.values.length - 1] : 0;
        const peak = s.values.length ? Math.max(...s.values) : 0;
        span.append(dot, ` ${s.label} ${plot.fmt(last)}${unit}`);
        if (peak > last) {
          const small = document.createElement('small');
          small.textContent = ` (peak ${plot.fmt(peak)}${unit})`;
          span.append(small);
        }
        return span;
      }),
    );
  }

  function drawCharts() {
    if (currentView() !== 'overview') return;
    const rates = RATE_SERIES.map((s) => ({ ...s, values: history[s.key] }));
    plot.draw($('#rate-chart'), { series: rates, capacity: HISTORY, stepSeconds: POLL_MS / 1000 });
    const byKey = (k) => rates.find((s) => s.key === k);
    legend($('#rate-legend'), ['received', 'sent', 'dropped'].map(byKey), '/s');
    const conns = [{ key: 'connections', label: 'connections', color: '#7c3aed', values: history.connections }];
    plot.draw($('#conn-chart'), { series: conns, capacity: HISTORY, stepSeconds: POLL_MS / 1000 });
    legend($('#conn-legend'), conns, '');
  }

  async function poll() {
    if (!waitingForToken) {
      try {
        await sample();
      } catch (e) {
        failed(e);
        if (!(e instanceof Unauthorized)) {
          $('#poll-state').textContent = 'not answering';
          $('#poll-state').classList.add('stale');
        }
      }
    }
    setTimeout(poll, POLL_MS);
  }

  window.addEventListener('resize', drawCharts);

  // ---------------------------------------------------------------------------------
  // Clients.

  async function loadClients() {
    const form = $('#client-search');
    const q = query(form);
    const list = await api('GET', '/clients?' + q);
    const rows = list.map((c) => {
      const tr = document.createElement('tr');
      tr.dataset.clientid = c.clientid;
      const addr = c.ip_address ? (c.port ? `${c.ip_address}:${c.port}` : c.ip_address) : '';
      const proto = { 3: '3.1', 4: '3.1.1', 5: '5' }[c.proto_ver] || '';
      const kick = twoStep('Kick', 'Confirm kick', async () => {
        await api('DELETE', '/clients/' + encodeURIComponent(c.clientid));
        showBanner(`Kicked ${c.clientid}: its connection is closed and its session discarded.`, 'info');
        await loadClients();
      });
      const actions = document.createElement('td');
      actions.append(kick);
      tr.append(
        cell(c.clientid, 'mono'),
        cell(c.username),
        cell(addr, 'mono'),
        cell(proto),
        cell(c.connected ? 'yes' : 'no', c.connected ? 'yes' : 'no'),
        cell(c.connected_at),
        cell(c.keepalive, 'num'),
        cell(c.subscriptions_cnt, 'num'),
        cell(`${c.inflight} / ${c.max_inflight}`, 'num'),
        cell(`${c.mqueue_len} / ${c.max_mqueue}`, 'num'),
        actions,
      );
      return tr;
    });
    fill($('#clients-table tbody'), rows, 'no client matches', 11);
    const limit = Number(q.get('_limit') || 0);
    $('#clients-count').textContent =
      `${list.length} client${list.length === 1 ? '' : 's'}` +
      (limit && list.length >= limit ? ` (the first ${limit}: raise "At most" or narrow the search)` : '');
    loaded('clients');
  }

  // ---------------------------------------------------------------------------------
  // Subscriptions.

  function subOptions(o) {
    const parts = [];
    if (o.group !== undefined) parts.push(`share ${o.group}`);
    if (o.limit_subs !== undefined) parts.push(`limit ${o.limit_subs}`);
    if (o.exclusive) parts.push('exclusive');
    if (o.no_local) parts.push('no local');
    if (o.retain_as_published) parts.push('retain as published');
    // 0 (send retained messages at subscribe) is MQTT's default: only a change is news.
    if (o.retain_handling) parts.push(`retain handling ${o.retain_handling}`);
    if (o.id !== undefined) parts.push(`id ${o.id}`);
    return parts.join(', ');
  }

  async function loadSubscriptions() {
    const q = query($('#sub-search'));
    const list = await api('GET', '/subscriptions?' + q);
    const rows = list.map((s) => {
      const tr = document.createElement('tr');
      tr.dataset.clientid = s.clientid;
      tr.dataset.topic = s.topic;
      const o = s.opts || {};
      tr.append(
        cell(s.clientid, 'mono'),
        cell(s.topic, 'mono'),
        cell(o.qos, 'num'),
        cell(subOptions(o)),
        cell(s.client_addr, 'mono'),
        cell(s.node_id),
      );
      return tr;
    });
    fill($('#subs-table tbody'), rows, 'no subscription matches', 6);
    $('#subs-count').textContent = `${list.length} subscription${list.length === 1 ? '' : 's'}`;
    loaded('subscriptions');
  }

  // ---------------------------------------------------------------------------------
  // Retained messages, a page at a time.

  let retainedOffset = 0;

  // Text when the payload is UTF-8, else its size and first bytes in hex.
  function payloadText(b64) {
    const raw = atob(b64 || '');
    const bytesOf = Uint8Array.from(raw, (ch) => ch.charCodeAt(0));
    try {
      const text = new TextDecoder('utf-8', { fatal: true }).decode(bytesOf);
      return { text: text.length > 200 ? text.slice(0, 200) + '…' : text, binary: false };
    } catch (_) {
      const hex = Array.from(bytesOf.slice(0, 24), (x) => x.toString(16).padStart(2, '0')).join(' ');
      return { text: `${bytesOf.length} bytes: ${hex}${bytesOf.length > 24 ? ' …' : ''}`, binary: true };
    }
  }

  async function loadRetained() {
    const form = $('#retained-search');
    const q = query(form);
    const limit = Number(q.get('limit') || 50);
    q.set('offset', String(retainedOffset));
    const page = await api('GET', '/retains?' + q);
    const rows = page.items.map((r) => {
      const tr = document.createElement('tr');
      tr.dataset.topic = r.topic;
      const p = payloadText(r.publish && r.publish.payload);
      const del = twoStep('Delete', 'Confirm delete', async () => {
        await api('DELETE', '/retains?' + new URLSearchParams({ topic: r.topic }));
        showBanner(`Deleted the retained message of ${r.topic}.`, 'info');
        await loadRetained();
      });
      const actions = document.createElement('td');
      actions.append(del);
      tr.append(
        cell(r.topic, 'mono'),
        cell(r.publish ? r.publish.qos : '', 'num'),
        cell(p.text, p.binary ? 'mono payload binary' : 'mono payload'),
        cell(r.client_id === null ? '(broker)' : r.client_id, 'mono'),
        actions,
      );
      return tr;
    });
    fill($('#retained-table tbody'), rows, 'no retained message matches', 5);
    const first = page.items.length ? retainedOffset + 1 : 0;
    $('#retained-count').textContent =
      page.items.length === 0
        ? 'none'
        : `messages ${first}–${retainedOffset + page.items.length}` + (page.has_more ? ', more on the next page' : '');
    $('#retained-prev').disabled = retainedOffset === 0;
    $('#retained-next').disabled = !page.has_more;
    $('#retained-next').dataset.step = String(limit);
    loaded('retained');
  }

  $('#retained-prev').addEventListener('click', () => {
    const step = Number($('#retained-next').dataset.step || 50);
    retainedOffset = Math.max(0, retainedOffset - step);
    loadRetained().catch(failed);
  });
  $('#retained-next').addEventListener('click', () => {
    retainedOffset += Number($('#retained-next').dataset.step || 50);
    loadRetained().catch(failed);
  });

  // ---------------------------------------------------------------------------------
  // Publish.

  function publishBody(form) {
    const f = new FormData(form);
    const body = {
      topic: String(f.get('topic')).trim(),
      payload: String(f.get('payload')),
      encoding: String(f.get('encoding')),
      qos: Number(f.get('qos')),
      retain: f.get('retain') !== null,
    };
    const props = {};
    for (const k of ['content_type', 'response_topic']) {
      const v = String(f.get(k) || '').trim();
      if (v) props[k] = v;
    }
    const expiry = String(f.get('message_expiry_interval') || '').trim();
    if (expiry) props.message_expiry_interval = Number(expiry);
    const users = String(f.get('user_properties') || '')
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l);
    if (users.length) {
      // Pairs, not an object: MQTT keeps order and repeated names, and so does the API.
      props.user_properties = users.map((l) => {
        const at = l.indexOf('=');
        return at < 0 ? [l, ''] : [l.slice(0, at).trim(), l.slice(at + 1).trim()];
      });
    }
    if (Object.keys(props).length) body.properties = props;
    return body;
  }

  $('#publish-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const out = $('#publish-result');
    out.className = 'result';
    out.textContent = 'publishing…';
    try {
      const body = publishBody(e.target);
      const answer = await api('POST', '/mqtt/publish', body);
      out.textContent = `Published to ${body.topic} (${String(answer).trim()}).`;
      out.classList.add('ok');
    } catch (err) {
      out.textContent = err instanceof Unauthorized ? 'token needed' : err.message;
      out.classList.add('bad');
    }
  });

  // ---------------------------------------------------------------------------------
  // Views.

  const LOADERS = {
    overview: async () => drawCharts(),
    clients: loadClients,
    subscriptions: loadSubscriptions,
    retained: loadRetained,
    publish: async () => loaded('publish'),
  };

  for (const [form, load] of [
    ['#client-search', loadClients],
    ['#sub-search', loadSubscriptions],
    [
      '#retained-search',
      () => {
        retainedOffset = 0;
        return loadRetained();
      },
    ],
  ]) {
    $(form).addEventListener('submit', (e) => {
      e.preventDefault();
      load().catch(failed);
    });
  }

  function currentView() {
    const v = location.hash.replace(/^#\/?/, '');
    return VIEWS.includes(v) ? v : 'overview';
  }

  function show(view) {
    if (!$('#banner').classList.contains('error')) hideBanner();
    for (const v of VIEWS) $('#view-' + v).hidden = v !== view;
    for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', a.dataset.view === view);
    document.title = `Starling · ${view}`;
    if (!waitingForToken) LOADERS[view]().catch(failed);
  }

  window.addEventListener('hashchange', () => show(currentView()));
  show(currentView());
  poll();
})();
