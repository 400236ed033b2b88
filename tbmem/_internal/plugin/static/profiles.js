// The Memory tab's profile windows (tbmem.profile): each window's offline summary (step time split, the
// top operators of torch.profiler's key_averages() by self time and by bytes, the memory tracks), its trace
// to download, and Perfetto in a frame (ui.perfetto.dev: needs the network; the summary does not).
// Strings from the logdir are only ever set as textContent.

import { api, el, fmtBytes, fmtNumber, table } from './util.js';

const PERFETTO = 'https://ui.perfetto.dev';
const SVG = 'http://www.w3.org/2000/svg';
const PHASE_COLORS = { forward: '#4e79a7', backward: '#f28e2b', optimizer: '#59a14f', 'data loading': '#b07aa1', other: '#bab0ac' };
const SERIES_COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f'];

export const profiles = { run: null, list: [], shown: null };

export function profileSection() {
  return el('section', { id: 'profile-box' },
    el('h2', { text: 'Profile windows' }), el('div', { id: 'profiles' }),
    el('div', { id: 'profile-detail', hidden: '' }));
}

const ms = (us) => (us / 1000).toFixed(us >= 100000 ? 0 : 2);

export async function loadProfiles(run) {
  profiles.run = run;
  profiles.shown = null;
  const box = document.getElementById('profiles');
  document.getElementById('profile-detail').hidden = true;
  let list;
  try { list = await api('profiles', { run }); } catch (e) { box.replaceChildren(el('p', { class: 'error', text: String(e.message) })); return; }
  if (run !== profiles.run) return;
  profiles.list = list;
  if (!list.length) {
    box.replaceChildren(el('p', { class: 'empty', text: 'No profile windows in this run (MemoryWriter profile=..., or tbmem.profile in a trainer config: docs/profile.md).' }));
    return;
  }
  box.replaceChildren(table(['first step', 'rank', 'size', 'file', ''], list.map((w) => [
    String(w.step), String(w.rank), fmtBytes(w.bytes), w.name,
    el('button', { type: 'button', class: 'show-profile', text: 'Show', onclick: () => showProfile(w.name) })]), 'profile-table'));
  await showProfile(list[list.length - 1].name);
}

async function showProfile(name) {
  const run = profiles.run;
  const detail = document.getElementById('profile-detail');
  let doc;
  try { doc = await api('profile', { run, name }); } catch (e) {
    detail.hidden = false;
    detail.replaceChildren(el('p', { class: 'error', text: String(e.message) }));
    return;
  }
  if (run !== profiles.run) return;
  profiles.shown = doc;
  try { drawProfile(detail, doc, name, run); } catch (e) {  // a summary of the wrong shape: one line, the rest of the tab stays
    profiles.shown = null;
    detail.replaceChildren(el('p', { class: 'error', text: `${name}: its summary cannot be drawn (${e.message || e})` }));
  }
  detail.hidden = false;
}

function drawProfile(detail, doc, name, run) {
  const s = doc.summary;
  const url = `profile_trace?${new URLSearchParams({ run, name })}`;
  const clock = doc.clock ? `tbmem's tracks are on torch.profiler's clock to within ±${doc.clock.uncertainty_us.toFixed(1)} µs.` : '';
  detail.replaceChildren(
    el('h3', { id: 'profile-title', text: `Steps ${doc.first_step}–${doc.last_step}, rank ${doc.rank}: ${s.steps.length} step${s.steps.length === 1 ? '' : 's'} in ${ms(s.total_us)} ms` }),
    el('div', { class: 'profile-actions' },
      el('a', { id: 'profile-download', href: url, download: name, text: 'Download trace' }),
      el('button', { id: 'profile-perfetto', type: 'button', text: 'Open in Perfetto', onclick: () => openPerfetto(url, name) }),
      el('span', { class: 'hint', text: 'Perfetto (ui.perfetto.dev) needs the network; this summary does not.' })),
    el('h3', { text: 'Step time split' }), splitBar(s), splitTable(s),
    el('div', { class: 'cols' },
      el('div', {}, el('h3', { text: 'Top operators by self CPU time' }), opTable(s.operators.by_self_time, 'ops-time')),
      el('div', {}, el('h3', { text: 'Top operators by bytes allocated (self: allocated minus freed in the operator)' }),
        s.operators.by_bytes.length ? opTable(s.operators.by_bytes, 'ops-bytes') : el('p', { class: 'empty', text: 'No operator allocated memory (profile_memory off?).' }))),
    ...fieldOps(s),
    el('h3', { text: 'Memory over the window (tbmem\'s records)' }), tracks(s),
    el('p', { class: 'hint', text: `${clock} Operators are torch.profiler's key_averages() of the window; phases come from the trainer's marks; other: the rest of each step, tbmem's own record included.` }),
    el('div', { id: 'perfetto-box', hidden: '' }));
}

// PhiFlow's field operations (the PhysicalTrainer's named ranges): time and bytes allocated inside each
function fieldOps(s) {
  const f = s.field_operations;
  if (!f || !f.by_time.length) return [];
  return [el('h3', { text: 'PhiFlow field operations (time and bytes allocated inside, over the window)' }),
    table(['operation', 'calls', 'ms', 'bytes allocated', 'net bytes'], f.by_time.map((r) => [
      r.name, String(r.count), ms(r.total_us), fmtBytes(r.allocated_bytes), fmtBytes(r.net_bytes)]), 'field-ops')];
}

function splitBar(s) {
  const bar = el('div', { class: 'split-bar', id: 'split-bar' });
  for (const [k, v] of Object.entries(s.split_us)) {
    if (!(v > 0) || !(s.total_us > 0)) continue;
    const seg = el('div', { class: 'seg', title: `${k}: ${ms(v)} ms` });
    seg.style.width = `${(100 * v / s.total_us).toFixed(2)}%`;
    seg.style.background = PHASE_COLORS[k] || '#999';
    bar.append(seg);
  }
  return bar;
}

function splitTable(s) {
  return table(['part', 'ms', '% of the steps'], Object.entries(s.split_us).map(([k, v]) => [
    k, ms(v), s.total_us > 0 ? (100 * v / s.total_us).toFixed(1) : '–']), 'split-table');
}

function opTable(rows, cls) {
  return table(['operator', 'calls', 'self CPU ms', 'CPU total ms', 'self bytes'], rows.map((r) => [
    r.name, String(r.count), ms(r.self_cpu_us), ms(r.cpu_total_us), fmtBytes(r.self_bytes)]), cls);
}

function tracks(s) {
  const box = el('div', { class: 'tracks', id: 'profile-tracks' });
  const names = Object.keys(s.tracks);
  if (!names.length) { box.append(el('p', { class: 'empty', text: 'No memory record in this window.' })); return box; }
  const x1 = Math.max(1e-9, ...names.flatMap((n) => Object.values(s.tracks[n]).flatMap((pts) => pts.map((p) => p[0]))),
    (s.total_us / 1000) || 0);
  const x0 = Math.min(0, ...names.flatMap((n) => Object.values(s.tracks[n]).flatMap((pts) => pts.map((p) => p[0]))));
  for (const name of names) box.append(trackChart(name, s.tracks[name], x0, x1, s));
  return box;
}

function trackChart(name, series, x0, x1, s) {
  const W = 640, H = 120, L = 64, R = 8, T = 8, B = 22;
  const vals = Object.values(series).flatMap((pts) => pts.map((p) => p[1]));
  let lo = Math.min(...vals), hi = Math.max(...vals);
  if (hi - lo < 1e-12) { lo -= 0.5 * Math.abs(lo || 1) * 0.01; hi += 0.5 * Math.abs(hi || 1) * 0.01; }
  const sx = (x) => L + (W - L - R) * (x - x0) / (x1 - x0 || 1);
  const sy = (y) => T + (H - T - B) * (1 - (y - lo) / (hi - lo));
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  svg.setAttribute('class', 'track-chart');
  const add = (tag, attrs, text) => {
    const n = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text != null) n.textContent = text;
    svg.append(n);
    return n;
  };
  for (const st of s.steps) {  // step boundaries, from the window's first step
    const x = sx((st.ts - s.steps[0].ts) / 1000);
    add('line', { x1: x, x2: x, y1: T, y2: H - B, stroke: '#e0e0e0' });
    add('text', { x: x + 2, y: H - 8, 'font-size': 10, fill: '#757575' }, `step ${st.step}`);
  }
  add('text', { x: W - R, y: H - 8, 'font-size': 10, fill: '#757575', 'text-anchor': 'end' }, `${(x1 - x0).toFixed(1)} ms`);
  add('text', { x: 2, y: T + 8, 'font-size': 10, fill: '#424242' }, fmtNumber(hi));
  add('text', { x: 2, y: H - B, 'font-size': 10, fill: '#424242' }, fmtNumber(lo));
  const legend = el('div', { class: 'track-legend' }, el('b', { text: name }));
  Object.entries(series).forEach(([label, pts], i) => {
    const color = SERIES_COLORS[i % SERIES_COLORS.length];
    add('polyline', { fill: 'none', stroke: color, 'stroke-width': 1.5, points: pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(' ') });
    for (const p of pts) add('circle', { cx: sx(p[0]).toFixed(1), cy: sy(p[1]).toFixed(1), r: 2, fill: color });
    const sw = el('span', { class: 'swatch' });
    sw.style.background = color;
    legend.append(el('span', {}, sw, `${label} ${fmtNumber(pts[pts.length - 1][1])}`));
  });
  return el('div', { class: 'track' }, legend, svg);
}

// Perfetto's documented way to open a trace from another page: frame ui.perfetto.dev, wait for its PONG,
// post the file's bytes. Needs the network (ui.perfetto.dev is not bundled).
async function openPerfetto(url, name) {
  const box = document.getElementById('perfetto-box');
  const response = await fetch(url);
  if (!response.ok) { box.hidden = false; box.replaceChildren(el('p', { class: 'error', text: `could not read ${name} (HTTP ${response.status})` })); return; }
  const buffer = await response.arrayBuffer();
  const frame = el('iframe', { id: 'perfetto', src: PERFETTO, title: 'Perfetto' });
  box.replaceChildren(el('p', { class: 'hint', text: 'Loading ui.perfetto.dev (needs the network)…' }), frame);
  box.hidden = false;
  let ready = false;
  const onMessage = (e) => {
    if (e.origin !== PERFETTO || e.data !== 'PONG' || ready) return;
    ready = true;
    window.removeEventListener('message', onMessage);
    frame.contentWindow.postMessage({ perfetto: { buffer, title: name, fileName: name } }, PERFETTO);
  };
  window.addEventListener('message', onMessage);
  for (let i = 0; i < 40 && !ready; i++) {
    try { frame.contentWindow.postMessage('PING', PERFETTO); } catch (e) { /* not loaded yet */ }
    await new Promise((r) => setTimeout(r, 250));
  }
  if (!ready) box.firstChild.textContent = 'ui.perfetto.dev did not answer (no network?). Download the trace and open it at ui.perfetto.dev or chrome://tracing.';
}
