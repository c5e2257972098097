// throng serve: helpers shared by the index page (index.js) and the run page
// (run.js). Plain ES2020, no module loader: this file is loaded with a plain
// <script> before the page script and defines everything once on the frozen
// global `window.Throng`; each page takes what it needs from there. Every
// string from the server is put into the page with textContent / attributes,
// never parsed as HTML.
//
// The token never reaches a script: the server answers the address it printed
// (?token=...) with an HttpOnly, SameSite=Strict cookie that every request of
// the page carries, and the page only drops the token from the address bar.
'use strict';

(function () {
  // Drop ?token= from the address bar (and from history), and what an older
  // page kept in session storage.
  function dropToken() {
    try {
      sessionStorage.removeItem('throng-token');
      const params = new URLSearchParams(location.search);
      if (params.has('token')) {
        params.delete('token');
        const q = params.toString();
        history.replaceState(history.state, '', location.pathname + (q ? '?' + q : '') + location.hash);
      }
    } catch (_) { /* nothing kept */ }
  }

  // The words for a request the server refused for want of its token.
  const NO_TOKEN = 'this server needs its token: open the address `throng serve` printed (it ends in ?token=…)';

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

  const $ = (id) => document.getElementById(id);

  async function getJSON(url) {
    const r = await fetch(url, { headers: { Accept: 'application/json' }, cache: 'no-store', credentials: 'same-origin' });
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

  // Statuses the server reports; anything else is shown as "unknown" styling.
  // `interrupted`: the manifest says running but no writer is alive (the run
  // was killed); `throng run --resume` continues it.
  const KNOWN_STATUS = Object.freeze(['running', 'paused', 'interrupted', 'finished', 'failed', 'damaged']);

  // Default tooltips for status badges (a caller's title, e.g. the damage
  // text, takes precedence).
  const STATUS_TITLE = Object.freeze({
    interrupted: 'interrupted: killed; resumable with throng run --resume',
  });

  // The class suffix for a status: itself when known, otherwise 'unknown'.
  function statusClass(status) {
    return KNOWN_STATUS.includes(status) ? status : 'unknown';
  }

  function badge(status, title) {
    const s = String(status || 'unknown');
    const cls = statusClass(s);
    const tip = title || (Object.prototype.hasOwnProperty.call(STATUS_TITLE, s) ? STATUS_TITLE[s] : null);
    return el('span', { class: 'badge badge-' + cls, title: tip || null }, s);
  }

  window.Throng = Object.freeze({
    dropToken,
    NO_TOKEN,
    el,
    $,
    getJSON,
    isNum,
    fmtInt,
    fmtRate,
    fmtBytes,
    fmtEta,
    fmtTime,
    KNOWN_STATUS,
    STATUS_TITLE,
    statusClass,
    badge,
  });
})();
