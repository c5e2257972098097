// throng serve: the index page (table of runs, kept live by /api/events).
// Plain ES2020, no framework. Every string from the server is put into the
// page with textContent / attributes, never parsed as HTML.
'use strict';

(function () {
  // ---------- shared helpers (duplicated in run.js: no module loader) ----------

  const TOKEN_KEY = 'throng-token';

  // Read ?token= once, keep it in sessionStorage, drop it from the address bar.
  function takeToken() {
    let token = '';
    try {
      const params = new URLSearchParams(location.search);
      if (params.has('token')) {
        const t = params.get('token') || '';
        if (t) sessionStorage.setItem(TOKEN_KEY, t);
        params.delete('token');
        const q = params.toString();
        history.replaceState(history.state, '', location.pathname + (q ? '?' + q : '') + location.hash);
      }
      token = sessionStorage.getItem(TOKEN_KEY) || '';
    } catch (_) {
      token = '';
    }
    return token;
  }

  // Build an element: el('a', {href: u, class: 'x'}, 'text', childNode, ...).
  // Strings become text nodes; nothing is ever parsed as HTML.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v === null || v === undefined || v === false) continue;
        if (k === 'class') node.className = v;
        else if (k === 'text') node.textContent = v;
        else node.setAttribute(k, v === true ? '' : String(v));
      }
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  async function getJSON(url) {
    const r = await fetch(url, { headers: { Accept: 'application/json' }, cache: 'no-store' });
    let body = null;
    try { body = await r.json(); } catch (_) { body = null; }
    if (!r.ok) {
      const e = new Error((body && body.error) || (r.status + ' ' + r.statusText));
      e.status = r.status;
      throw e;
    }
    return body;
  }

  const isNum = (v) => typeof v === 'number' && Number.isFinite(v);

  function fmtInt(v) {
    return isNum(v) ? Math.round(v).toLocaleString('en-US') : '—';
  }

  function fmtRate(v) {
    if (!isNum(v)) return '—';
    const a = Math.abs(v);
    if (a >= 100) return Math.round(v).toLocaleString('en-US');
    if (a >= 1) return v.toFixed(1);
    return v.toFixed(2);
  }

  function fmtBytes(v) {
    if (!isNum(v)) return '—';
    const units = ['KiB', 'MiB', 'GiB', 'TiB'];
    if (Math.abs(v) < 1024) return Math.round(v) + ' B';
    let x = v;
    let u = -1;
    while (Math.abs(x) >= 1024 && u < units.length - 1) { x /= 1024; u++; }
    return (x >= 100 ? x.toFixed(0) : x.toFixed(1)) + ' ' + units[u];
  }

  function fmtEta(s) {
    if (!isNum(s) || s < 0) return '—';
    if (s < 1) return '< 1 s';
    if (s < 60) return Math.round(s) + ' s';
    if (s < 3600) return Math.round(s / 60) + ' min';
    if (s < 86400) {
      const h = Math.floor(s / 3600);
      const m = Math.round((s - h * 3600) / 60);
      return m ? h + ' h ' + m + ' min' : h + ' h';
    }
    const d = Math.floor(s / 86400);
    const h = Math.round((s - d * 86400) / 3600);
    return h ? d + ' d ' + h + ' h' : d + ' d';
  }

  function fmtTime(iso) {
    if (!iso) return '—';
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    const opts = { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' };
    if (d.getFullYear() !== new Date().getFullYear()) opts.year = 'numeric';
    return d.toLocaleString(undefined, opts);
  }

  const KNOWN_STATUS = ['running', 'paused', 'finished', 'failed', 'damaged'];

  function badge(status, title) {
    const s = String(status || 'unknown');
    const cls = KNOWN_STATUS.includes(s) ? s : 'unknown';
    return el('span', { class: 'badge badge-' + cls, title: title || null }, s);
  }

  function runUrl(id) {
    return '/runs/' + encodeURIComponent(id);
  }

  // ---------- page ----------

  const token = takeToken();
  const tbody = document.querySelector('#runs tbody');
  const conn = document.getElementById('conn');
  const message = document.getElementById('message');

  let latest = null;          // latest {runs: [...]}
  let frame = 0;              // pending requestAnimationFrame id

  function setConn(text, cls) {
    conn.textContent = text || '';
    conn.className = 'conn' + (cls ? ' ' + cls : '');
  }

  function showMessage(text, isError) {
    message.hidden = !text;
    message.textContent = text || '';
    message.className = 'message' + (isError ? ' error' : '');
  }

  function schedule(data) {
    latest = data;
    if (!frame) frame = requestAnimationFrame(() => { frame = 0; render(); });
  }

  function cellsFor(tr) {
    if (!tr._cells) {
      const names = ['name', 'scenario', 'status', 'steps', 'eta', 'model', 'device',
        'ranks', 'dps', 'started', 'size', 'report'];
      const numeric = new Set(['ranks', 'dps', 'size']);
      tr._cells = {};
      for (const n of names) {
        const td = el('td', { class: n + (numeric.has(n) ? ' num' : '') });
        tr.append(td);
        tr._cells[n] = td;
      }
    }
    return tr._cells;
  }

  function fillRow(tr, run) {
    const c = cellsFor(tr);
    const id = String(run.id);
    const damaged = run.status === 'damaged';

    const nameLink = el('a', { href: runUrl(id), title: run.path || null }, run.name || id);
    const nameParts = [nameLink];
    if (damaged && run.damage) nameParts.push(el('div', { class: 'damage' }, run.damage));
    c.name.replaceChildren(...nameParts);

    c.scenario.textContent = run.scenario || '—';
    c.status.replaceChildren(badge(run.status, damaged ? run.damage : null));

    const done = isNum(run.steps_done) ? run.steps_done : 0;
    const planned = isNum(run.planned_steps) ? run.planned_steps : null;
    const stepsText = planned ? done + ' / ' + planned : String(done);
    const parts = [el('span', { class: 'steps-text' }, stepsText)];
    if (planned) {
      const pct = Math.max(0, Math.min(100, (100 * done) / planned));
      const fill = el('span');
      fill.style.width = pct.toFixed(1) + '%';
      parts.push(el('span', { class: 'bar', title: pct.toFixed(0) + '%', 'aria-hidden': 'true' }, fill));
    }
    c.steps.replaceChildren(...parts);

    c.eta.textContent = fmtEta(run.eta_seconds);
    c.model.textContent = run.model || '—';
    c.device.textContent = run.device || '—';
    c.ranks.textContent = fmtInt(run.ranks);
    c.dps.textContent = fmtRate(run.decisions_per_second);
    c.started.textContent = fmtTime(run.started);
    c.started.title = run.started || '';
    c.size.textContent = fmtBytes(run.disk_bytes);
    c.size.title = isNum(run.disk_bytes) ? run.disk_bytes.toLocaleString('en-US') + ' bytes' : '';
    c.report.replaceChildren(run.report
      ? el('a', { href: runUrl(id) + '/files/report.html' }, 'report')
      : '');
    tr.className = 'run status-' + (KNOWN_STATUS.includes(run.status) ? run.status : 'unknown');
  }

  function render() {
    const runs = (latest && Array.isArray(latest.runs)) ? latest.runs : [];
    const existing = new Map();
    for (const tr of tbody.querySelectorAll('tr[data-id]')) existing.set(tr.dataset.id, tr);
    for (const tr of tbody.querySelectorAll('tr:not([data-id])')) tr.remove();

    let prev = null;
    const seen = new Set();
    for (const run of runs) {
      if (!run || run.id === undefined || run.id === null) continue;
      const id = String(run.id);
      if (seen.has(id)) continue;
      seen.add(id);
      let tr = existing.get(id);
      if (!tr) {
        tr = el('tr');
        tr.dataset.id = id;
      }
      fillRow(tr, run);
      // Keep server order, moving rows only when needed.
      const want = prev ? prev.nextSibling : tbody.firstChild;
      if (want !== tr) tbody.insertBefore(tr, want);
      prev = tr;
    }
    for (const [id, tr] of existing) if (!seen.has(id)) tr.remove();

    if (!seen.size) {
      tbody.append(el('tr', { class: 'empty' },
        el('td', { colspan: '12', class: 'muted' }, 'No runs yet.')));
    }
  }

  let source = null;
  let retryTimer = 0;
  let retryDelay = 3000;

  function connect() {
    if (source) source.close();
    source = new EventSource('/api/events');
    source.addEventListener('open', () => setConn('live', 'ok'));
    source.addEventListener('runs', (ev) => {
      setConn('live', 'ok');
      retryDelay = 3000;
      try { schedule(JSON.parse(ev.data)); } catch (e) { showMessage('bad event from server: ' + e.message, true); }
    });
    source.addEventListener('error', () => {
      setConn('reconnecting…', 'warn');
      // EventSource retries by itself unless the server refused the stream.
      if (source.readyState === EventSource.CLOSED && !retryTimer) {
        retryTimer = setTimeout(() => { retryTimer = 0; connect(); }, retryDelay);
        retryDelay = Math.min(30000, retryDelay * 2);
      }
    });
  }

  async function start() {
    document.getElementById('token-note').textContent = token ? 'controls: token set' : '';
    getJSON('/api/server').then((s) => {
      const info = [];
      if (s && s.root) info.push('root: ' + String(s.root));
      if (s && s.version) info.push('v' + s.version);
      if (s && s.read_only) info.push('read-only');
      document.getElementById('server-info').textContent = info.join(' · ');
    }).catch(() => { /* informational only */ });

    try {
      schedule(await getJSON('/api/runs'));
    } catch (e) {
      showMessage('could not list runs: ' + e.message, true);
    }
    connect();
  }

  start();
})();
