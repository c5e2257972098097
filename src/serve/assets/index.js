// throng serve: the index page (table of runs, kept live by /api/events).
// Plain ES2020, no framework. Every string from the server is put into the
// page with textContent / attributes, never parsed as HTML.
'use strict';

(function () {
  // ---------- shared helpers (common.js, loaded first) ----------

  const {
    dropToken, NO_TOKEN, el, $, getJSON, isNum,
    fmtInt, fmtRate, fmtBytes, fmtEta, fmtTime,
    statusClass, badge,
  } = window.Throng;

  function runUrl(id) {
    return '/runs/' + encodeURIComponent(id);
  }

  // ---------- page ----------

  dropToken();
  const tbody = document.querySelector('#runs tbody');
  const conn = $('conn');
  const message = $('message');

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
      const names = ['folder', 'name', 'scenario', 'policy', 'status', 'steps', 'eta', 'model',
        'device', 'ranks', 'dps', 'started', 'size', 'report'];
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

    // The folder tells runs of one config apart (they share the config's name).
    const folderLink = el('a', { href: runUrl(id), title: run.path || null }, run.folder || run.name || id);
    const folderParts = [folderLink];
    if (damaged && run.damage) folderParts.push(el('div', { class: 'damage' }, run.damage));
    c.folder.replaceChildren(...folderParts);
    c.name.textContent = run.name || '—';

    c.scenario.textContent = run.scenario || '—';
    c.policy.textContent = run.policy || '—';
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
    // The model's rate: scripted decisions cost nothing and would inflate it.
    c.dps.textContent = fmtRate(isNum(run.model_decisions_per_second)
      ? run.model_decisions_per_second : run.decisions_per_second);
    c.dps.title = isNum(run.scripted_decisions_per_second)
      ? fmtRate(run.scripted_decisions_per_second) + ' scripted decisions/s besides' : '';
    c.started.textContent = fmtTime(run.started);
    c.started.title = run.started || '';
    c.size.textContent = fmtBytes(run.disk_bytes);
    c.size.title = isNum(run.disk_bytes) ? run.disk_bytes.toLocaleString('en-US') + ' bytes' : '';
    c.report.replaceChildren(run.report
      ? el('a', { href: runUrl(id) + '/files/report.html' }, 'report')
      : '');
    tr.className = 'run status-' + statusClass(run.status);
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
        el('td', { colspan: '14', class: 'muted' }, 'No runs yet.')));
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
    try {
      const s = await getJSON('/api/server');
      const info = [];
      if (s && s.root) info.push('root: ' + String(s.root));
      if (s && s.version) info.push('v' + s.version);
      if (s && s.read_only) info.push('read-only');
      $('server-info').textContent = info.join(' · ');
    } catch (e) {
      showMessage(e.status === 401 || e.status === 403 ? NO_TOKEN : 'could not reach the server: ' + e.message, true);
      return;
    }

    try {
      schedule(await getJSON('/api/runs'));
    } catch (e) {
      showMessage('could not list runs: ' + e.message, true);
    }
    connect();
  }

  start();
})();
