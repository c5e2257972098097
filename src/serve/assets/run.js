// throng serve: one run's page (header, charts, measures, ranks, controls, decisions,
// replay).
// Plain ES2020, no framework; charts go through uPlot (vendor/uplot). Every string
// from the server (model replies, prompts, names) is put into the page with
// textContent or attributes, never parsed as HTML.
'use strict';

(function () {
  // ---------- shared helpers (common.js, loaded first) ----------

  const {
    dropToken, NO_TOKEN, el, $, getJSON, isNum,
    fmtInt, fmtRate, fmtBytes, fmtEta, fmtTime,
    badge,
  } = window.Throng;

  // ---------- page-only helpers ----------

  function fmtVal(v) {
    if (v === null || v === undefined) return '—';
    if (typeof v !== 'number') return typeof v === 'object' ? compactJSON(v) : String(v);
    if (!Number.isFinite(v)) return String(v);
    if (Number.isInteger(v)) return v.toLocaleString('en-US');
    const a = Math.abs(v);
    if (a >= 1000) return v.toLocaleString('en-US', { maximumFractionDigits: 1 });
    if (a >= 1) return String(+v.toFixed(3));
    return String(+v.toPrecision(3));
  }

  function fmtPct(v) {
    return isNum(v) ? (100 * v).toFixed(1) + '%' : '—';
  }

  function fmtSec(v) {
    if (!isNum(v)) return '—';
    return (Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(3)) + ' s';
  }

  function compactJSON(v) {
    if (v === null || v === undefined) return '—';
    try { return JSON.stringify(v); } catch (_) { return String(v); }
  }

  function prettyJSON(v) {
    if (v === null || v === undefined) return '—';
    try { return JSON.stringify(v, null, 2); } catch (_) { return String(v); }
  }

  function truncate(s, n) {
    const t = String(s);
    return t.length > n ? t.slice(0, n - 1) + '…' : t;
  }

  // ---------- page state ----------

  const match = location.pathname.match(/^\/runs\/([^/]+)/);
  const runId = match ? decodeURIComponent(match[1]) : '';
  const runPath = '/runs/' + encodeURIComponent(runId);
  const api = '/api/runs/' + encodeURIComponent(runId);
  dropToken();

  const state = {
    detail: null,       // latest RunDetail
    authorized: false,  // the server took this page's token (its cookie)
    readOnly: false,    // from /api/server
    gone: false,        // the run folder disappeared
    busy: false,        // a control request is in flight
    follow: true,       // decisions and replay follow the latest step
    step: null,         // the chosen step when not following
  };

  let frame = 0;
  function scheduleRender() {
    if (!frame) frame = requestAnimationFrame(() => { frame = 0; render(); });
  }

  function setConn(text, cls) {
    const c = $('conn');
    c.textContent = text || '';
    c.className = 'conn' + (cls ? ' ' + cls : '');
  }

  function showMessage(text, isError, extra) {
    const m = $('message');
    m.hidden = !text;
    m.className = 'message' + (isError ? ' error' : '');
    m.replaceChildren(text || '');
    if (extra) m.append(' ', extra);
  }

  function fileUrl(name) {
    return runPath + '/files/' + String(name).split('/').map(encodeURIComponent).join('/');
  }

  // ---------- header ----------

  function renderHeader(d) {
    const s = d.summary || {};
    // The folder names the run: every run of a config has the config's name.
    const name = s.folder || s.name || runId;
    document.title = name + ' · throng';
    $('run-name').textContent = name;
    $('crumb-name').textContent = name;
    $('run-status').replaceChildren(badge(s.status, s.status === 'damaged' ? s.damage : null));
    $('run-path').textContent = (s.path || '') + (s.name ? ' · config ' + s.name : '');

    const dmg = $('damage');
    const damaged = s.status === 'damaged' && s.damage;
    dmg.hidden = !damaged;
    dmg.textContent = damaged ? s.damage : '';

    const done = isNum(s.steps_done) ? Math.round(s.steps_done) : 0;
    const planned = isNum(s.planned_steps) && s.planned_steps > 0 ? s.planned_steps : null;
    $('steps-done').textContent = String(done);
    $('planned-steps').textContent = planned ? String(planned) : '—';
    const bar = $('steps-bar');
    bar.hidden = !planned;
    if (planned) {
      const pct = Math.max(0, Math.min(100, (100 * done) / planned));
      bar.firstElementChild.style.width = pct.toFixed(1) + '%';
      bar.title = pct.toFixed(0) + '%';
    }
    $('eta').textContent = fmtEta(s.eta_seconds);
    $('scenario').textContent = s.scenario || '—';
    $('policy').textContent = s.policy || '—';
    $('model').textContent = s.model || '—';
    $('device').textContent = s.device || '—';
    $('ranks-count').textContent = fmtInt(s.ranks);
    // Apart: scripted decisions cost nothing and would inflate the model's rate.
    const split = isNum(s.model_decisions_per_second);
    $('dps').textContent = fmtRate(split ? s.model_decisions_per_second : s.decisions_per_second);
    $('sdps').textContent = split ? fmtRate(s.scripted_decisions_per_second) : '—';
    $('started').textContent = fmtTime(s.started);
    $('started').title = s.started || '';
    $('size').textContent = fmtBytes(s.disk_bytes);

    const files = Array.isArray(d.files) ? d.files.map(String) : [];
    const hasReport = !!s.report || files.includes('report.html');
    const parts = [];
    if (hasReport) {
      parts.push(el('a', { id: 'report-link', class: 'report-link', href: fileUrl('report.html') }, 'open report'));
    }
    const others = files.filter((f) => f !== 'report.html');
    if (others.length) {
      const list = el('span', { class: 'file-list' }, el('span', { class: 'muted' }, 'files: '));
      others.forEach((f, i) => {
        if (i) list.append(' · ');
        list.append(el('a', { href: fileUrl(f) }, f));
      });
      parts.push(list);
    }
    $('files').replaceChildren(...parts);

    // The records, as downloads (attachments: nothing of a run folder opens as a page).
    const records = Array.isArray(d.downloads) ? d.downloads.map(String) : [];
    const sig = records.join('\n');
    if ($('downloads')._sig !== sig) {
      $('downloads')._sig = sig;
      const list = records.length ? [el('span', { class: 'muted' }, 'records: ')] : [];
      records.forEach((f, i) => {
        if (i) list.push(' · ');
        list.push(el('a', { href: fileUrl(f), download: f.split('/').pop() }, f));
      });
      $('downloads').replaceChildren(...list);
    }
  }

  async function loadConfig() {
    try {
      const c = await getJSON(api + '/config');
      $('config-text').textContent = c && c.text !== undefined ? String(c.text) : '';
    } catch (e) {
      $('config-text').textContent = 'the config cannot be shown: ' + e.message;
    }
  }

  // ---------- controls ----------

  function renderControls(d) {
    const ctl = d.controls || {};
    const can = state.authorized && !state.readOnly && !state.gone && !state.busy;
    $('pause').disabled = !(can && ctl.pause);
    $('resume').disabled = !(can && ctl.resume);
    $('delete').disabled = !(can && ctl.delete);
    let note = '';
    if (state.gone) note = 'the run folder is gone';
    else if (state.readOnly) note = 'the server is read-only';
    else if (!state.authorized) note = NO_TOKEN;
    $('control-note').textContent = note;

    const child = d.child;
    const box = $('child-box');
    if (!child) {
      box.hidden = true;
      return;
    }
    box.hidden = false;
    let st = 'running';
    if (!child.running) st = child.exit === null || child.exit === undefined ? 'ended' : 'exited with code ' + child.exit;
    $('child-state').textContent = st;
    const pre = $('child');
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
    const text = (Array.isArray(child.output) ? child.output : []).map(String).join('\n');
    if (pre.textContent !== text) {
      pre.textContent = text;
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }
  }

  async function control(action, body) {
    if (!state.authorized) return false;
    state.busy = true;
    scheduleRender();
    showMessage(action + '…');
    try {
      const r = await fetch(api + '/' + action, {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
        body: JSON.stringify(body || {}),
      });
      let j = null;
      try { j = await r.json(); } catch (_) { j = null; }
      if (r.ok) {
        showMessage((j && j.message) || (action + ': accepted (' + r.status + ')'), false,
          action === 'delete' ? el('a', { href: '/' }, 'back to runs') : null);
      } else {
        showMessage(action + ' refused: ' + ((j && j.error) || (r.status + ' ' + r.statusText)), true);
      }
      return r.ok;
    } catch (e) {
      showMessage(action + ' failed: ' + e.message, true);
      return false;
    } finally {
      state.busy = false;
      scheduleRender();
    }
  }

  $('pause').addEventListener('click', () => control('pause'));
  $('resume').addEventListener('click', () => control('resume'));
  $('delete').addEventListener('click', () => {
    // The folder's name: every run of a config shares the config's name.
    const s = (state.detail && state.detail.summary) || {};
    const name = s.folder || runId;
    const typed = window.prompt(
      'Delete the run in folder "' + name + '" and the whole folder? This cannot be undone.\n' +
      'Type the folder\'s name (' + name + ') to confirm:', '');
    if (typed === null) {
      showMessage('Delete cancelled.');
      return;
    }
    if (typed === '') {
      showMessage('Delete cancelled: no name typed.');
      return;
    }
    control('delete', { confirm: typed });
  });

  // ---------- charts (uPlot) ----------

  const PALETTE = ['#2563eb', '#dc2626', '#16a34a', '#d97706', '#7c3aed', '#0891b2', '#db2777', '#4b5563',
    '#65a30d', '#9333ea'];
  const INT_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];
  const CHART_H = 200;
  const charts = new Map();          // id -> {u, sig, div}
  const panelCharts = new Map();     // the measures' panels, likewise
  const chartCtx = { rows: [], multiPop: false, raw: {} };

  // Legend label of an x value (the row index, 1-based).
  function xLabel(v) {
    if (v === null || v === undefined) return '—';
    const row = chartCtx.rows[v - 1];
    if (!row) return String(v);
    if (!chartCtx.multiPop && row.step === v) return String(v);
    let t = '#' + v + ' · step ' + fmtVal(row.step);
    if (chartCtx.multiPop) t += ' · population ' + fmtVal(row.population);
    return t;
  }

  function intTicks(u, splits) {
    return splits.map((v) => (Number.isInteger(v) ? v.toLocaleString('en-US') : ''));
  }

  function col(rows, f) {
    return rows.map((r) => {
      const v = f(r);
      return isNum(v) ? v : null;
    });
  }

  function stepChartDefs(rows) {
    const x = rows.map((_, i) => i + 1);
    const shareKeys = [
      ['forward', (r) => r.forward_seconds],
      ['masks', (r) => r.mask_seconds],
      ['templates', (r) => (r.template_seconds || 0) + (r.tokenize_seconds || 0)],
      ['records', (r) => r.record_seconds],
    ];
    const shares = shareKeys.map(() => []);
    const other = [];
    for (const r of rows) {
      const parts = shareKeys.map(([, f]) => Math.max(0, isNum(f(r)) ? f(r) : 0));
      const sum = parts.reduce((a, b) => a + b, 0);
      const total = Math.max(isNum(r.seconds) ? r.seconds : 0, sum);
      parts.forEach((p, k) => shares[k].push(total > 0 ? p / total : null));
      other.push(total > 0 ? (total - sum) / total : null);
    }
    shares.push(other);
    const stackedData = [];
    const acc = rows.map(() => 0);
    for (const s of shares) {
      stackedData.push(s.map((v, i) => (v === null ? null : (acc[i] += v))));
    }

    return [
      {
        id: 'throughput', title: 'Throughput',
        series: [
          { label: 'model decisions/s', fmt: fmtRate },
          { label: 'scripted decisions/s', fmt: fmtRate },
          { label: 'tokens/s', scale: 'tok', fmt: fmtRate },
        ],
        axes: [{ label: 'decisions/s' }, { scale: 'tok', label: 'tokens/s', side: 1 }],
        min0: true,
        data: [
          x,
          col(rows, (r) => (isNum(r.model_decisions_per_second)
            ? r.model_decisions_per_second : r.decisions_per_second)),
          col(rows, (r) => r.scripted_decisions_per_second),
          col(rows, (r) => r.tokens_per_second),
        ],
      },
      {
        id: 'prefix', title: 'Prefix-cache hit rate',
        series: [{ label: 'hit rate', fmt: fmtPct }],
        axes: [{ values: (u, sp) => sp.map((v) => Math.round(v * 100) + '%') }],
        range: [0, 1],
        data: [x, col(rows, (r) => r.prefix_hit_rate)],
      },
      {
        id: 'kv', title: 'KV memory (MiB)',
        series: [{ label: 'KV MiB', fmt: (v) => v.toFixed(1) + ' MiB' }],
        axes: [{ label: 'MiB' }],
        min0: true,
        data: [x, col(rows, (r) => (isNum(r.kv_bytes) ? r.kv_bytes / 1048576 : null))],
      },
      {
        id: 'fallbacks', title: 'Fallbacks and clamps per step',
        series: [{ label: 'fallbacks', fmt: fmtInt }, { label: 'clamps', fmt: fmtInt }],
        axes: [{ incrs: INT_INCRS, values: intTicks }],
        min0: true,
        data: [x, col(rows, (r) => r.fallbacks), col(rows, (r) => r.clamped)],
      },
      {
        id: 'time-share', title: 'Share of step time (stacked)',
        series: ['forward', 'masks', 'templates', 'records', 'other'].map((label) => ({ label })),
        axes: [{ values: (u, sp) => sp.map((v) => Math.round(v * 100) + '%') }],
        range: [0, 1],
        stacked: true,
        raw: shares,
        data: [x, ...stackedData],
      },
    ];
  }

  // A panel of the server's (a measure, its lines by arm and replicate) as a chart:
  // the arms in their colours, each replicate a thin line in its arm's colour, a group
  // level's lowest and highest dashed.
  function panelDef(p, rows, arms) {
    const n = rows.length;
    const lines = (Array.isArray(p.lines) ? p.lines : []).filter((l) => l && Array.isArray(l.points));
    if (!n || !lines.length) return null;
    const series = [];
    const data = [rows.map((_, i) => i + 1)];
    for (const l of lines) {
      const arm = String(l.arm);
      if (!arms.includes(arm)) arms.push(arm);
      const color = PALETTE[arms.indexOf(arm) % PALETTE.length];
      const replicate = isNum(l.replicate);
      let label = arm;
      if (replicate) label += ' · replicate ' + l.replicate;
      if (l.stat) label += ' · ' + l.stat;
      series.push({
        label,
        fmt: fmtVal,
        color: replicate ? color + '66' : color,
        width: replicate ? 1 : 2,
        dash: l.stat && l.stat !== 'mean' ? [4, 3] : null,
      });
      const ys = new Array(n).fill(null);
      for (const pt of l.points) {
        if (Array.isArray(pt) && pt[0] >= 1 && pt[0] <= n && isNum(pt[1])) ys[pt[0] - 1] = pt[1];
      }
      data.push(ys);
    }
    return {
      id: 'panel-' + String(p.source) + '-' + String(p.level || '') + '-' + String(p.measure),
      title: String(p.title || p.measure),
      measure: String(p.measure),
      source: String(p.source),
      series,
      spanGaps: true,
      data,
    };
  }

  function chartSig(def) {
    return JSON.stringify([def.id, def.plainX || false, def.series.map((s) => [s.label, s.scale || 'y', s.color || ''])]);
  }

  // Legend values: the hovered point, or the newest point when the cursor is away.
  function lastIdx(u) {
    return u.data && u.data[0] ? u.data[0].length - 1 : -1;
  }

  function makeOpts(def, width) {
    const xText = def.plainX ? (v) => (v === null || v === undefined ? '—' : fmtVal(v)) : xLabel;
    const series = [{
      label: def.plainX ? (def.xAxisLabel || 'step') : 'step',
      value: (u, v, si, idx) => {
        if (idx === null || idx === undefined) {
          const k = lastIdx(u);
          return k < 0 ? '—' : 'latest ' + xText(u.data[0][k]);
        }
        return xText(v);
      },
    }];
    def.series.forEach((s, i) => {
      const color = PALETTE[i % PALETTE.length];
      const fmt = s.fmt || fmtVal;
      const ser = {
        label: s.label,
        scale: s.scale || 'y',
        stroke: s.color || color,
        width: s.width || 1.5,
        spanGaps: !!def.spanGaps,
        // A thin line (a replicate's) has no points: they would hide the arms' lines.
        points: s.width && s.width < 1.5 ? { show: false } : { size: 4 },
      };
      if (s.dash) ser.dash = s.dash;
      if (def.stacked) ser.fill = color + '59';
      ser.value = (u, v, si, idx) => {
        if (idx === null || idx === undefined) {
          idx = lastIdx(u);
          if (idx < 0) return '—';
          v = u.data[si][idx];
        }
        if (def.stacked) {
          const raw = chartCtx.raw[def.id];
          return raw && raw[si - 1] ? fmtPct(raw[si - 1][idx]) : '—';
        }
        return v === null || v === undefined ? '—' : fmt(v);
      };
      series.push(ser);
    });

    // Wide enough for the longest tick label, so that labels like 4,000,000 never run under
    // the axis title.
    function yAxisSize(u, values) {
      const longest = (values || []).reduce((m, v) => Math.max(m, String(v).length), 0);
      return Math.max(48, 24 + 7 * longest);
    }
    const axes = [{
      label: def.plainX ? (def.xAxisLabel || 'step') : (chartCtx.multiPop ? 'step row (#)' : 'step'),
      incrs: INT_INCRS,
      values: intTicks,
      size: 40,
    }];
    const yAxes = def.axes && def.axes.length ? def.axes : [{}];
    yAxes.forEach((a, i) => {
      axes.push(Object.assign({ scale: 'y', size: yAxisSize }, a, i > 0 ? { grid: { show: false } } : {}));
    });

    const scales = { x: { time: false } };
    if (def.range) {
      scales.y = { range: def.range };
    } else if (def.min0) {
      const r0 = (u, min, max) => [0, isNum(max) && max > 0 ? max * 1.08 : 1];
      scales.y = { range: r0 };
      for (const s of def.series) if (s.scale && s.scale !== 'y') scales[s.scale] = { range: r0 };
    }

    const opts = {
      title: def.title,
      width,
      height: CHART_H,
      scales,
      series,
      axes,
      legend: { live: true },
      cursor: def.plainX ? {} : { sync: { key: 'throng-run-' + runId } },
      hooks: {
        // The chart's own y range, on its element (what each panel's scale is).
        setScale: [(u, key) => {
          const box = u.root.parentElement;
          if (key === 'y' && box) {
            box.dataset.yMin = String(u.scales.y.min);
            box.dataset.yMax = String(u.scales.y.max);
          }
        }],
      },
    };
    if (def.stacked) {
      opts.bands = [];
      for (let i = 2; i <= def.series.length; i++) opts.bands.push({ series: [i, i - 1] });
    }
    return opts;
  }

  function chartWidth(div) {
    const w = div.clientWidth || Math.floor(($('charts').clientWidth || 1160) / 2) - 12;
    return Math.max(260, Math.floor(w));
  }

  function renderCharts(d) {
    if (typeof uPlot === 'undefined') {
      $('no-steps').hidden = false;
      $('no-steps').textContent = 'chart library failed to load';
      return;
    }
    const rows = (Array.isArray(d.steps) ? d.steps : []).filter((r) => r && typeof r === 'object');
    chartCtx.rows = rows;
    const pops = [];
    rows.forEach((r, i) => {
      if (!pops.length || pops[pops.length - 1].population !== r.population) {
        pops.push({ population: r.population, from: i + 1, to: i + 1 });
      } else {
        pops[pops.length - 1].to = i + 1;
      }
    });
    const multiPop = pops.length > 1;
    const popChanged = multiPop !== chartCtx.multiPop;
    chartCtx.multiPop = multiPop;

    const note = $('pop-note');
    note.hidden = !multiPop;
    note.textContent = multiPop
      ? 'Population changes restart step numbers, so x is the row number: ' +
        pops.map((p) => (p.from === p.to ? 'row ' + p.from : 'rows ' + p.from + '–' + p.to) +
          ' population ' + fmtVal(p.population)).join('; ') + '.'
      : '';

    const defs = rows.length ? stepChartDefs(rows) : [];
    $('no-steps').hidden = defs.length > 0;
    $('no-steps').textContent = 'No steps recorded yet.';
    drawCharts($('charts'), defs, charts, popChanged);

    const arms = [];
    const panels = (Array.isArray(d.panels) ? d.panels : [])
      .map((p) => (p && typeof p === 'object' ? panelDef(p, rows, arms) : null))
      .filter((p) => p);
    $('panels-section').hidden = !panels.length;
    drawCharts($('panels'), panels, panelCharts, popChanged);
  }

  // Draws `defs` into `box`, reusing the charts of `map` whose series are unchanged.
  function drawCharts(box, defs, map, rebuild) {
    const keep = new Set(defs.map((def) => def.id));
    for (const [id, c] of map) {
      if (!keep.has(id)) {
        c.u.destroy();
        c.div.remove();
        map.delete(id);
      }
    }
    let prev = null;
    for (const def of defs) {
      if (def.raw) chartCtx.raw[def.id] = def.raw;
      const sig = chartSig(def);
      let c = map.get(def.id);
      if (!c) {
        c = { div: el('div', { class: 'chart', id: 'chart-' + def.id }), u: null, sig: '' };
        if (def.measure) {
          c.div.dataset.measure = def.measure;
          c.div.dataset.source = def.source;
        }
        map.set(def.id, c);
      }
      const want = prev ? prev.nextSibling : box.firstChild;
      if (want !== c.div) box.insertBefore(c.div, want);
      prev = c.div;
      if (!c.u || c.sig !== sig || rebuild) {
        // New series (or x meaning changed): build the chart again.
        if (c.u) c.u.destroy();
        c.div.replaceChildren();
        c.sig = sig;
        c.u = new uPlot(makeOpts(def, chartWidth(c.div)), def.data, c.div);
      } else {
        c.u.setData(def.data);
      }
    }
  }

  let resizeFrame = 0;
  window.addEventListener('resize', () => {
    if (resizeFrame) return;
    resizeFrame = requestAnimationFrame(() => {
      resizeFrame = 0;
      for (const c of [...charts.values(), ...panelCharts.values()]) {
        c.u.setSize({ width: chartWidth(c.div), height: CHART_H });
      }
    });
  });

  // ---------- ranks ----------

  function renderRanks(d) {
    const tbody = document.querySelector('#ranks tbody');
    const ranks = Array.isArray(d.ranks) ? d.ranks : [];
    if (!ranks.length) {
      tbody.replaceChildren(el('tr', { class: 'empty' }, el('td', { colspan: '4', class: 'muted' }, 'no rank information')));
      return;
    }
    tbody.replaceChildren(...ranks.map((r) => {
      const st = String(r.status || '');
      const tr = el('tr', { class: st === 'slow' || st === 'lost' ? 'bad' : null },
        el('td', { class: 'num' }, fmtInt(r.rank)),
        el('td', null, el('span', { class: 'badge rank-' + (['ok', 'slow', 'lost'].includes(st) ? st : 'unknown') }, st || '—')),
        el('td', { class: 'num' }, fmtInt(r.last_step)),
        el('td', { class: 'num' }, fmtSec(r.step_seconds)));
      tr.dataset.rank = String(r.rank);
      return tr;
    }));
  }

  // ---------- render ----------

  function render() {
    const d = state.detail;
    if (!d) return;
    renderHeader(d);
    renderControls(d);
    renderCharts(d);
    renderRanks(d);
    renderReplayControls();
  }

  // ---------- replay ----------

  const replay = { view: null, step: null, seq: 0, loading: 0, timer: 0, loadedFor: null };

  // The latest step a replay can show: the server's last_step when known, and the
  // step number of the newest row of steps.csv (a live run moves past a stale last_step).
  function latestStep() {
    const d = state.detail;
    const rows = d && Array.isArray(d.steps) ? d.steps : [];
    const s = (d && d.summary) || {};
    let guess = rows.length && isNum(rows[rows.length - 1].step)
      ? rows[rows.length - 1].step
      : (isNum(s.steps_done) ? s.steps_done : 0);
    if (replay.view && isNum(replay.view.last_step)) guess = Math.max(guess, replay.view.last_step);
    return Math.max(0, Math.round(guess));
  }

  function renderReplayControls() {
    const last = latestStep();
    const sec = $('replay');
    sec.hidden = last < 1;
    if (last < 1) return;
    const range = $('replay-step');
    range.max = String(last);
    const cur = replay.step === null ? last : Math.min(replay.step, last);
    if (document.activeElement !== range || replay.step === null) range.value = String(cur);
    $('replay-label').textContent = 'step ' + range.value + ' / ' + last + (state.follow ? ' (latest)' : '');
    $('replay-prev').disabled = Number(range.value) <= 1;
    $('replay-next').disabled = Number(range.value) >= last;
    $('replay-latest').disabled = state.follow;
  }

  async function loadReplay(n, retried) {
    const seq = ++replay.seq;
    replay.step = n;
    renderReplayControls();
    try {
      const v = await getJSON(api + '/steps/' + encodeURIComponent(n));
      if (seq !== replay.seq) return;
      replay.view = v || {};
      replay.step = isNum(replay.view.step) ? replay.view.step : n;
      $('replay-error').hidden = true;
      renderReplay();
      renderReplayControls();
    } catch (e) {
      if (seq !== replay.seq) return;
      // The latest step guessed from steps.csv may not be replayable: ask the
      // server for step 1 to learn last_step, then show that one.
      if (!retried && e.status === 404 && n !== 1) {
        try {
          const v1 = await getJSON(api + '/steps/1');
          if (seq !== replay.seq) return;
          const last = v1 && isNum(v1.last_step) ? v1.last_step : 1;
          replay.view = v1;
          if (last >= 1 && last < n) {
            loadReplay(state.follow ? last : Math.min(n, last), true);
            return;
          }
        } catch (_) { /* fall through to the error below */ }
      }
      if (seq !== replay.seq) return;
      const box = $('replay-error');
      box.hidden = false;
      box.textContent = 'step ' + n + ': ' + e.message;
    }
  }

  function renderReplay() {
    const v = replay.view || {};
    const stateRows = Array.isArray(v.state) ? v.state : [];
    const st = document.querySelector('#replay-state tbody');
    st.replaceChildren(...(stateRows.length
      ? stateRows.map((r) => el('tr', null,
        el('td', { class: 'mono' }, r.column === undefined ? '—' : String(r.column)),
        el('td', { class: 'num' }, fmtVal(r.agents)),
        el('td', { class: 'num' }, fmtVal(r.mean)),
        el('td', { class: 'num' }, fmtVal(r.min)),
        el('td', { class: 'num' }, fmtVal(r.max))))
      : [el('tr', { class: 'empty' }, el('td', { colspan: '5', class: 'muted' }, 'no numeric state columns'))]));

    const aggs = Array.isArray(v.aggregates) ? v.aggregates : [];
    const keys = [];
    for (const a of aggs) {
      if (a && a.values && typeof a.values === 'object') {
        for (const k of Object.keys(a.values)) if (!keys.includes(k)) keys.push(k);
      }
    }
    const head = document.querySelector('#replay-aggregates thead tr');
    head.replaceChildren(el('th', null, 'arm'), el('th', { class: 'num' }, 'population'),
      el('th', { class: 'num' }, 'replicate'), ...keys.map((k) => el('th', { class: 'num' }, k)));
    const ab = document.querySelector('#replay-aggregates tbody');
    ab.replaceChildren(...(aggs.length
      ? aggs.map((a) => el('tr', null,
        el('td', null, a.arm === undefined ? '—' : String(a.arm)),
        el('td', { class: 'num' }, fmtVal(a.population)),
        el('td', { class: 'num' }, fmtVal(a.replicate)),
        ...keys.map((k) => el('td', { class: 'num' }, fmtVal(a.values ? a.values[k] : null)))))
      : [el('tr', { class: 'empty' }, el('td', { colspan: String(3 + keys.length), class: 'muted' }, 'no aggregates'))]));
  }

  // Pick one step for both replay and decisions (stops following the latest).
  function chooseStep(n) {
    if (!isNum(n)) return;
    n = Math.max(1, Math.round(n));
    const same = !state.follow && state.step === n;
    const shown = dec.resp && dec.resp.step === n;
    state.follow = false;
    state.step = n;
    setStepSelect(n);
    if (!same && !shown) {
      firstPage();
      loadDecisions();
    }
    if (!(replay.step === n && replay.view && replay.view.step === n)) loadReplay(n);
    renderReplayControls();
  }

  function followLatest() {
    state.follow = true;
    state.step = null;
    setStepSelect(null);
    firstPage();
    loadDecisions();
    const last = latestStep();
    if (last >= 1) {
      replay.loadedFor = last;
      loadReplay(last);
    }
    renderReplayControls();
  }

  $('replay-step').addEventListener('input', () => {
    const n = Number($('replay-step').value);
    $('replay-label').textContent = 'step ' + n + ' / ' + $('replay-step').max;
    clearTimeout(replay.timer);
    replay.timer = setTimeout(() => chooseStep(n), 200);
  });
  $('replay-step').addEventListener('change', () => {
    clearTimeout(replay.timer);
    chooseStep(Number($('replay-step').value));
  });
  $('replay-prev').addEventListener('click', () => {
    const cur = replay.step === null ? latestStep() : replay.step;
    if (cur > 1) chooseStep(cur - 1);
  });
  $('replay-next').addEventListener('click', () => {
    const cur = replay.step === null ? latestStep() : replay.step;
    if (cur < latestStep()) chooseStep(cur + 1);
  });
  $('replay-latest').addEventListener('click', followLatest);

  // ---------- decisions ----------

  // `from`: where the page shown starts (null: the step's first line); `back`: the starts
  // of the pages before it, for "previous".
  const dec = {
    inflight: false, again: false, resp: null, expanded: new Set(), prompts: new Map(),
    from: null, back: [],
  };
  const PAGE = 200;

  // Back to a step's first page (a filter or the step changed).
  function firstPage() {
    dec.from = null;
    dec.back = [];
  }

  function setOptions(select, options, current) {
    const opts = options.slice();
    if (current !== '' && !opts.some(([v]) => v === current)) opts.push([current, current]);
    const sig = JSON.stringify(opts);
    if (select._sig !== sig) {
      select._sig = sig;
      select.replaceChildren(...opts.map(([v, label]) => el('option', { value: v }, label)));
    }
    select.value = current;
  }

  function setStepSelect(n) {
    const sel = $('f-step');
    const cur = n === null ? '' : String(n);
    if (cur !== '' && !Array.from(sel.options).some((o) => o.value === cur)) {
      sel.append(el('option', { value: cur }, 'step ' + cur));
      sel._sig = '';
    }
    sel.value = cur;
  }

  function decisionsQuery() {
    const p = new URLSearchParams();
    if (!state.follow && state.step !== null) p.set('step', String(state.step));
    const arm = $('f-arm').value;
    if (arm) p.set('arm', arm);
    const replicate = $('f-replicate').value;
    if (replicate !== '') p.set('replicate', replicate);
    const role = $('f-role').value;
    if (role) p.set('role', role);
    const fb = $('f-fallback').value;
    if (fb) p.set('fallback', fb);
    const attr = $('f-attribute').value;
    const val = $('f-value').value;
    if (attr && val !== '') {
      p.set('attribute', attr);
      p.set('value', val);
    }
    p.set('limit', String(PAGE));
    if (dec.from !== null) p.set('from', String(dec.from));
    return p.toString();
  }

  async function loadDecisions() {
    if (dec.inflight) {
      dec.again = true;
      return;
    }
    dec.inflight = true;
    try {
      do {
        dec.again = false;
        try {
          const r = await getJSON(api + '/decisions?' + decisionsQuery());
          // Shown even when a newer request is waiting: while a run writes fast, a table
          // that waited for the newest answer would stay empty.
          dec.resp = r || {};
          $('decisions-error').hidden = true;
          renderDecisions();
        } catch (e) {
          if (e.status === 400 && dec.from !== null) {
            // The page's start is no longer one of the step's (the step moved on).
            firstPage();
            dec.again = true;
            continue;
          }
          if (dec.again) continue;
          const box = $('decisions-error');
          box.hidden = false;
          box.className = 'message' + (e.status === 404 ? '' : ' error');
          box.textContent = e.status === 404 ? 'No decisions logged for this run yet.' : 'decisions: ' + e.message;
          dec.resp = null;
          document.querySelector('#decisions tbody').replaceChildren();
          $('decisions-count').textContent = '';
        }
      } while (dec.again);
    } finally {
      dec.inflight = false;
    }
  }

  // One agent of one cell: an open detail stays open when the table moves to another step.
  function decisionKey(d) {
    return [d.arm, d.population, d.replicate, d.agent, d.role].map((v) => String(v)).join('|');
  }

  function renderDecisions() {
    const r = dec.resp || {};
    const steps = (Array.isArray(r.steps) ? r.steps : []).filter(isNum).slice().sort((a, b) => b - a);
    const going = r.in_progress && isNum(r.step) ? r.step : null;
    const stepLabel = (s) => 'step ' + s + (s === going ? ' (being written)' : '');
    const latestLabel = state.follow && isNum(r.step) ? 'latest (' + stepLabel(r.step) + ')' : 'latest';
    setOptions($('f-step'), [['', latestLabel], ...steps.map((s) => [String(s), stepLabel(s)])],
      state.follow || state.step === null ? '' : String(state.step));

    const arms = (Array.isArray(r.arms) ? r.arms : []).map(String);
    setOptions($('f-arm'), [['', 'all'], ...arms.map((x) => [x, x])], $('f-arm').value);
    const reps = (Array.isArray(r.replicates) ? r.replicates : []).filter(isNum).map(String);
    setOptions($('f-replicate'), [['', 'all'], ...reps.map((x) => [x, x])], $('f-replicate').value);

    const roles = (Array.isArray(r.roles) ? r.roles : []).map(String);
    setOptions($('f-role'), [['', 'all'], ...roles.map((x) => [x, x])], $('f-role').value);

    const attrs = r.attributes && typeof r.attributes === 'object' ? r.attributes : {};
    const attrSel = $('f-attribute');
    setOptions(attrSel, [['', '—'], ...Object.keys(attrs).map((k) => [k, k])], attrSel.value);
    renderValueOptions();

    const list = Array.isArray(r.decisions) ? r.decisions : [];
    const page = dec.back.length + 1;
    $('decisions-count').textContent = (isNum(r.step) ? stepLabel(r.step) + ' · ' : '') +
      'page ' + page + ' · ' + list.length + ' shown';
    let pageNote = isNum(r.next) ? 'more follow' : (page > 1 ? 'the step\'s last page' : '');
    if (r.truncated) {
      pageNote = 'read ' + fmtInt(r.scanned) + ' logged decisions without filling the page: next reads on';
    }
    if (r.problem) pageNote = String(r.problem);
    $('dec-page').textContent = pageNote;
    $('dec-prev').disabled = !dec.back.length;
    $('dec-next').disabled = !isNum(r.next);

    const tbody = document.querySelector('#decisions tbody');
    const rows = [];
    if (!list.length) {
      rows.push(el('tr', { class: 'empty' }, el('td', { colspan: '10', class: 'muted' }, 'no matching decisions')));
    }
    for (const d of list) {
      if (!d || typeof d !== 'object') continue;
      const key = decisionKey(d);
      const clamps = Array.isArray(d.clamps) ? d.clamps.map(String) : [];
      const flags = el('td', { class: 'flags' });
      if (d.fallback) flags.append(el('span', { class: 'badge badge-failed', title: String(d.fallback) }, 'fallback'), ' ', truncate(d.fallback, 60));
      if (clamps.length) {
        if (d.fallback) flags.append(el('br'));
        flags.append(el('span', { class: 'badge badge-paused', title: clamps.join('\n') }, 'clamps ' + clamps.length), ' ', truncate(clamps.join('; '), 60));
      }
      const reply = d.text === null || d.text === undefined ? null : String(d.text);
      const parsed = compactJSON(d.value);
      const decision = compactJSON(d.decision);
      const tr = el('tr', {
        class: 'decision' + (d.fallback ? ' fallback' : '') + (clamps.length ? ' clamped' : '') +
          (dec.expanded.has(key) ? ' open' : ''),
        tabindex: '0',
        'aria-expanded': dec.expanded.has(key) ? 'true' : 'false',
      },
      el('td', { class: 'num' }, fmtVal(d.agent)),
      el('td', null, d.arm === undefined || d.arm === null ? '—' : String(d.arm)),
      el('td', { class: 'num' }, fmtVal(d.replicate)),
      el('td', null, d.role ? String(d.role) : '—'),
      el('td', null, d.group ? String(d.group) : '—'),
      el('td', null, d.policy ? String(d.policy) : '—'),
      el('td', { class: 'mono reply', title: reply === null ? null : truncate(reply, 2000) }, reply === null ? '—' : truncate(reply, 100)),
      el('td', { class: 'mono', title: truncate(parsed, 2000) }, truncate(parsed, 80)),
      el('td', { class: 'mono', title: truncate(decision, 2000) }, truncate(decision, 80)),
      flags);
      tr._decision = d;
      tr.dataset.key = key;
      rows.push(tr);
      if (dec.expanded.has(key)) rows.push(detailRow(d, key));
    }
    tbody.replaceChildren(...rows);
  }

  function renderValueOptions() {
    const r = dec.resp || {};
    const attrs = r.attributes && typeof r.attributes === 'object' ? r.attributes : {};
    const attr = $('f-attribute').value;
    const sel = $('f-value');
    const values = attr && Array.isArray(attrs[attr]) ? attrs[attr].map(String) : [];
    sel.disabled = !attr;
    setOptions(sel, [['', 'any'], ...values.map((v) => [v, v])], attr ? sel.value : '');
  }

  function loadPrompt(hash) {
    let p = dec.prompts.get(hash);
    if (!p) {
      p = getJSON(api + '/prompts/' + encodeURIComponent(hash))
        .then((j) => ({ text: j && j.text !== undefined && j.text !== null ? String(j.text) : '' }))
        .catch((e) => {
          if (e.status === 404) return { missing: true };
          dec.prompts.delete(hash);
          return { error: e.message };
        });
      dec.prompts.set(hash, p);
    }
    return p;
  }

  function section(title, body, cls) {
    return el('div', { class: 'detail-part' + (cls ? ' ' + cls : '') }, el('h4', null, title), body);
  }

  function detailRow(d, key) {
    const promptPre = el('pre', { class: 'prompt' }, 'loading…');
    if (!d.prompt_hash) {
      promptPre.textContent = 'prompt not kept for this decision';
      promptPre.classList.add('muted');
    } else {
      loadPrompt(String(d.prompt_hash)).then((res) => {
        if (res.missing) {
          promptPre.textContent = 'prompt not kept for this decision';
          promptPre.classList.add('muted');
        } else if (res.error) {
          promptPre.textContent = 'could not load the prompt: ' + res.error;
          promptPre.classList.add('muted');
        } else {
          promptPre.textContent = res.text;
        }
      });
    }
    const reply = d.text === null || d.text === undefined ? null : String(d.text);
    const clamps = Array.isArray(d.clamps) ? d.clamps.map(String) : [];
    const where = 'arm ' + (d.arm ?? '—') + ' · population ' + fmtVal(d.population) + ' · replicate ' +
      fmtVal(d.replicate) + ' · step ' + fmtVal(d.step) + ' · agent ' + fmtVal(d.agent) +
      (d.prompt_hash ? ' · prompt ' + String(d.prompt_hash) : '');
    const body = el('div', { class: 'detail' },
      el('div', { class: 'muted small mono' }, where),
      el('div', { class: 'detail-grid' },
        section('Prompt', promptPre, 'wide'),
        section('Reply', el('pre', { class: reply === null ? 'muted' : null }, reply === null ? '(no reply: scripted or fallback decision)' : reply)),
        section('Parsed value', el('pre', null, prettyJSON(d.value))),
        section('Decision', el('pre', null, prettyJSON(d.decision))),
        section('Attributes', el('pre', null, prettyJSON(d.attributes))),
        d.fallback ? section('Fallback', el('pre', null, String(d.fallback))) : null,
        clamps.length ? section('Clamps', el('pre', null, clamps.join('\n'))) : null));
    const tr = el('tr', { class: 'detail-row' }, el('td', { colspan: '10' }, body));
    tr.dataset.detailFor = key;
    return tr;
  }

  function toggleDecision(tr) {
    const d = tr._decision;
    if (!d) return;
    const key = tr.dataset.key;
    const next = tr.nextElementSibling;
    if (next && next.dataset.detailFor === key) {
      next.remove();
      dec.expanded.delete(key);
      tr.classList.remove('open');
      tr.setAttribute('aria-expanded', 'false');
    } else {
      dec.expanded.add(key);
      tr.after(detailRow(d, key));
      tr.classList.add('open');
      tr.setAttribute('aria-expanded', 'true');
    }
  }

  const decBody = document.querySelector('#decisions tbody');
  decBody.addEventListener('click', (ev) => {
    if (ev.target.closest('a')) return;
    // Let people select text in an open detail without collapsing it.
    const tr = ev.target.closest('tr.decision');
    if (tr && decBody.contains(tr)) toggleDecision(tr);
  });
  decBody.addEventListener('keydown', (ev) => {
    if (ev.key !== 'Enter' && ev.key !== ' ') return;
    const tr = ev.target.closest('tr.decision');
    if (tr) {
      ev.preventDefault();
      toggleDecision(tr);
    }
  });

  $('f-step').addEventListener('change', () => {
    const v = $('f-step').value;
    firstPage();
    if (v === '') followLatest();
    else chooseStep(Number(v));
  });
  const refilter = () => {
    firstPage();
    loadDecisions();
  };
  $('f-arm').addEventListener('change', refilter);
  $('f-replicate').addEventListener('change', refilter);
  $('f-role').addEventListener('change', refilter);
  $('f-fallback').addEventListener('change', refilter);
  $('f-attribute').addEventListener('change', () => {
    $('f-value').value = '';
    renderValueOptions();
    refilter();
  });
  $('f-value').addEventListener('change', refilter);
  $('dec-next').addEventListener('click', () => {
    const r = dec.resp || {};
    if (!isNum(r.next)) return;
    // Paging keeps to the step shown, even while following the latest.
    if (state.follow && isNum(r.step)) chooseStep(r.step);
    dec.back.push(dec.from);
    dec.from = r.next;
    loadDecisions();
  });
  $('dec-prev').addEventListener('click', () => {
    if (!dec.back.length) return;
    dec.from = dec.back.pop();
    loadDecisions();
  });

  // ---------- live updates ----------

  // Run events can come in bursts (every write in the run folder): refresh the
  // decisions of the latest step at most once a second, always ending on the newest.
  let decTimer = 0;
  let decLast = 0;
  function refreshDecisionsSoon() {
    if (decTimer) return;
    const wait = Math.max(0, decLast + 1000 - Date.now());
    decTimer = setTimeout(() => {
      decTimer = 0;
      decLast = Date.now();
      if (state.follow) loadDecisions();
    }, wait);
  }

  function onDetail(d) {
    if (!d || typeof d !== 'object') return;
    state.detail = d;
    scheduleRender();
    if (state.follow) {
      refreshDecisionsSoon();
      const last = latestStep();
      if (last >= 1 && replay.loadedFor !== last) {
        replay.loadedFor = last;
        loadReplay(last);
      }
    }
  }

  let source = null;
  let retryTimer = 0;
  let retryDelay = 3000;

  function connect() {
    if (source) source.close();
    source = new EventSource(api + '/events');
    source.addEventListener('open', () => setConn('live', 'ok'));
    source.addEventListener('run', (ev) => {
      setConn('live', 'ok');
      retryDelay = 3000;
      let d;
      try { d = JSON.parse(ev.data); } catch (e) {
        showMessage('bad event from server: ' + e.message, true);
        return;
      }
      onDetail(d);
    });
    source.addEventListener('gone', () => {
      state.gone = true;
      source.close();
      setConn('gone', 'warn');
      showMessage('This run\'s folder is gone (deleted or moved).', true, el('a', { href: '/' }, 'back to runs'));
      scheduleRender();
    });
    source.addEventListener('error', () => {
      if (state.gone) return;
      setConn('reconnecting…', 'warn');
      // EventSource retries by itself unless the server refused the stream.
      if (source.readyState === EventSource.CLOSED && !retryTimer) {
        retryTimer = setTimeout(() => { retryTimer = 0; connect(); }, retryDelay);
        retryDelay = Math.min(30000, retryDelay * 2);
      }
    });
  }

  async function start() {
    if (!runId) {
      showMessage('no run id in the address', true);
      return;
    }
    try {
      const s = await getJSON('/api/server');
      state.authorized = true;
      state.readOnly = !!(s && s.read_only);
      if (state.readOnly) $('token-note').textContent = 'read-only server';
    } catch (e) {
      showMessage(e.status === 401 || e.status === 403 ? NO_TOKEN : 'could not reach the server: ' + e.message, true);
      return;
    }
    loadConfig();

    try {
      onDetail(await getJSON(api));
    } catch (e) {
      showMessage(e.status === 404 ? 'no run with id ' + runId : 'could not load the run: ' + e.message, true,
        el('a', { href: '/' }, 'back to runs'));
    }
    connect();
  }

  start();
})();
