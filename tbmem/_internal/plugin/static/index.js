// tbmem's Memory tab. TensorBoard loads this ES module in the plugin's iframe (base URL
// data/plugin/tbmem/) and calls render(). Every request goes to this plugin's own routes;
// charts are uPlot's (vendored, static/uPlot.iife.min.js), drawn by chart.js. Strings from the
// logdir are only ever set as textContent.

import { drawChart } from './chart.js';
import { compareRuns, createCompare } from './compare.js';
import { loadProfiles, profileSection, profiles } from './profiles.js';
import { showJob } from './ranks.js';
import { api, el, fmtBytes, fmtValue, loadScript, setUrlState, table, urlState } from './util.js';

// tbmem._internal.palette, injected by the plugin when it serves this file: one colour per category everywhere
const COLORS = /*tbmem:palette*/{ categories: {}, series: ['#4e79a7'], lines: ['#222222'], losses: ['#b35806'], runs: ['#222222'], marks: { snapshot: '#7b3294' } }/*end*/;

const state = {
  groups: [], group: null, run: null, breakdown: 'category', lines: null,
  overview: null, chart: null, step: null, snapshots: [], compare: null,
};
// the sections of the one-run view, hidden while the compare view is shown
const RUN_VIEW = ['run-label', 'rank-label', 'breakdown-label', 'lines-label', 'refresh', 'chart-box', 'at-box', 'ranks-box', 'snap-box', 'profile-box', 'findings-box'];

function status(text) { document.getElementById('status').textContent = text; }

// --- layout -------------------------------------------------------------------------------
function layout() {
  document.head.append(el('link', { rel: 'stylesheet', href: 'static/uPlot.min.css' }),
    el('link', { rel: 'stylesheet', href: 'static/style.css' }));
  const sel = (id, label, onchange) => el('label', { id: `${id}-label` }, label, el('select', { id, onchange }));
  document.body.append(
    el('header', {},
      sel('run', 'Run ', onGroup), sel('rank', 'Rank ', onRank), sel('breakdown', 'Breakdown ', onBreakdown),
      sel('lines', 'Lines ', onLines),
      el('button', { id: 'refresh', type: 'button', onclick: () => selectRun(state.run), text: 'Refresh' }),
      el('button', { id: 'compare-toggle', type: 'button', onclick: () => showCompare(!state.compare), text: 'Compare runs' }),
      el('span', { id: 'status' })),
    el('section', { id: 'compare-box', hidden: '' }),
    el('section', { id: 'chart-box' },
      el('h2', { id: 'chart-title', text: 'Memory over time' }),
      el('div', { id: 'chart' }),
      el('p', { class: 'hint', id: 'chart-note' }),
      el('p', { class: 'hint', id: 'smoothing-note', text: 'Every record is drawn as logged, never smoothed. TensorBoard\'s '
        + 'Time Series and Scalars smooth their lines by default (0.6: a memory step becomes a ramp, a count reads '
        + '20.9983). Exact values: Time Series, open TensorBoard at /?smoothing=0#timeseries (the address reaches '
        + 'Time Series only) or set Smoothing to 0 in its settings; Scalars, drag its Smoothing slider to 0.' })),
    el('section', { id: 'at-box', hidden: '' },
      el('h2', { id: 'at-title' }),
      el('div', { class: 'cols' }, el('div', { id: 'census' }), el('div', { id: 'readings' })),
      el('div', { id: 'top' })),
    el('section', { id: 'ranks-box', hidden: '' }, el('h2', { text: 'Ranks: peaks compared' }), el('div', { id: 'ranks' }),
      el('div', { id: 'job-box' })),
    el('section', { id: 'snap-box' },
      el('h2', { text: 'Snapshots' }), el('div', { id: 'snapshots' }),
      el('div', { id: 'viewer-box', hidden: '' },
        el('div', { class: 'viewer-head' }, el('span', { id: 'viewer-title' }),
          el('button', { type: 'button', text: 'Close', onclick: closeViewer })),
        el('iframe', { id: 'viewer', sandbox: 'allow-scripts', title: 'snapshot viewer' }))),
    profileSection(),
    el('section', { id: 'findings-box' },
      el('h2', { text: 'Findings' }), el('div', { id: 'leaks' }), el('div', { id: 'summary' })));
}

function fillSelect(id, options, value) {
  const s = document.getElementById(id);
  s.replaceChildren(...options.map(([v, label]) => el('option', { value: v, text: label })));
  if (value != null) s.value = value;
}

// --- runs ---------------------------------------------------------------------------------
// The run shown first: the one named in the address (the user's last choice), else the most recent
// run with a census, else the most recent with memory tags (never simply the first by name).
function firstRun(groups) {
  const wanted = urlState().run;
  for (const g of groups) { const m = g.members.find((r) => r.run === wanted); if (m) return [g, m]; }
  const members = groups.flatMap((g) => g.members.map((m) => [g, m]));
  const latest = (pairs) => pairs.reduce((a, b) => (a == null || (b[1].last_time ?? 0) > (a[1].last_time ?? 0) ? b : a), null);
  return latest(members.filter(([, m]) => m.census)) || latest(members.filter(([, m]) => m.memory)) || members[0];
}

async function loadRuns() {
  const doc = await api('runs');
  state.groups = doc.groups;
  if (!state.groups.length) { status('No runs in this logdir yet.'); return; }
  fillSelect('run', state.groups.map((g) => [g.group, g.group + (g.memory ? (g.census ? '' : ' (no census)') : ' (no memory tags)')]));
  const [group, member] = firstRun(state.groups);
  document.getElementById('run').value = group.group;
  await onGroup(member.run);
  const wanted = compareRuns(urlState().compare);  // the compare view, when the address names its runs
  if (wanted.length) await showCompare(true, wanted);
}

// --- the compare view (compare.js) ----------------------------------------------------------
async function showCompare(on, runs) {
  if (on && !state.compare) {
    state.compare = createCompare(document.getElementById('compare-box'),
      { palette: COLORS, runs: state.groups.flatMap((g) => g.members) });
    state.compare.setAlign(urlState().align);
  }
  for (const id of RUN_VIEW) {  // hidden while comparing; afterwards as the one-run view had them
    const node = document.getElementById(id);
    if (on && node.dataset.wasHidden === undefined) {
      node.dataset.wasHidden = node.hidden ? '1' : '';
      node.hidden = true;
    } else if (!on && node.dataset.wasHidden !== undefined) {
      node.hidden = node.dataset.wasHidden === '1';
      delete node.dataset.wasHidden;
    }
  }
  document.getElementById('compare-box').hidden = !on;
  document.getElementById('compare-toggle').textContent = on ? 'Back to one run' : 'Compare runs';
  if (on) await state.compare.run(runs);
  else { setUrlState({ compare: null, align: null }); state.compare = null; document.getElementById('compare-box').replaceChildren(); }
}

function currentGroup() { return state.groups.find((g) => g.group === document.getElementById('run').value); }

async function onGroup(run) {
  const g = currentGroup();
  state.group = g;
  const ranked = g.members.length > 1 || g.members[0].rank != null;
  document.getElementById('rank-label').hidden = !ranked;
  fillSelect('rank', g.members.map((m) => [m.run, m.rank == null ? `${m.run} (aggregate)` : `rank ${m.rank}`]));
  const member = g.members.find((m) => m.run === run) || g.members.find((m) => m.census) || g.members.find((m) => m.memory) || g.members[0];
  document.getElementById('rank').value = member.run;
  // a compact job may keep one rank's run only: the server says whether the group is one (loadRanks)
  document.getElementById('ranks-box').hidden = !g.members.some((m) => m.rank != null);
  if (!document.getElementById('ranks-box').hidden) loadRanks(g.group);
  await selectRun(member.run);
}

async function onRank() { await selectRun(document.getElementById('rank').value); }
async function onBreakdown() { state.breakdown = document.getElementById('breakdown').value; await loadOverview(); }
function onLines() { state.lines = document.getElementById('lines').value; draw(); }

async function selectRun(run) {
  state.run = run;
  state.step = null;
  setUrlState({ run });  // the choice survives a reload and goes with a copied address
  document.getElementById('at-box').hidden = true;
  closeViewer();
  // each part fails alone, as one line where it would be: a run's other panels (and a compare view the
  // address opens on it) still show when, say, one planted trace's summary has the wrong shape
  await Promise.all([
    loadOverview().catch((e) => status(`the chart could not be drawn: ${e.message || e}`)),
    loadSnapshots().catch((e) => partFailed('snapshots', 'the snapshots', e)),
    loadProfiles(run).catch((e) => partFailed('profiles', 'the profile windows', e))]);
  loadFindings().catch((e) => partFailed('leaks', 'the findings', e));  // after the first view: it may take longer (the summary imports pandas)
}

function partFailed(id, what, e) {
  document.getElementById(id).replaceChildren(el('p', { class: 'error', text: `${what} could not be shown: ${e.message || e}` }));
}

// --- the chart ----------------------------------------------------------------------------
async function loadOverview() {
  const run = state.run;
  status('loading…');
  const width = document.getElementById('chart').clientWidth || 1000;
  const breakdown = state.breakdown;
  const params = { run, breakdown, points: Math.max(100, Math.round(width)) };
  // quick: a very long series is first drawn from a sample, then redrawn from every record
  let doc = await api('overview', { ...params, quick: 1 });
  if (run !== state.run || breakdown !== state.breakdown) return;
  if (doc.sampled.length) {
    showOverview(doc);
    status(`drawn from a sample of ${doc.sampled.length} long series; loading every record…`);
    doc = await api('overview', params);
    if (run !== state.run || breakdown !== state.breakdown) return;
  }
  showOverview(doc);
  status('');
}

function showOverview(doc) {
  state.overview = doc;
  fillSelect('breakdown', Object.entries(doc.breakdowns).map(([b, has]) => [b, has ? b : `${b} (none logged)`]), doc.breakdown);
  const groups = Object.keys(doc.lines);
  if (!groups.includes(state.lines)) state.lines = groups.includes('device') ? 'device' : groups[0] || null;
  fillSelect('lines', groups.map((g) => [g, g === 'device' ? 'VRAM' : 'RSS']), state.lines);
  document.getElementById('lines-label').hidden = groups.length < 2;
  const n = Object.values(doc.records).reduce((a, b) => Math.max(a, b), 0);
  document.getElementById('chart-note').textContent =
    `${doc.census_steps.length} censuses, ${n} records${doc.sampled.length ? ' (a sample)' : ''} (drawn: lowest and highest record per pixel; hover shows each drawn record exactly). Click the chart for the census and readings at a step.`;
  draw();
}

function stackColor(label, i) {
  return state.breakdown === 'category' && COLORS.categories[label] ? COLORS.categories[label] : COLORS.series[i % COLORS.series.length];
}

function draw() {
  const doc = state.overview;
  const box = document.getElementById('chart');
  if (state.chart) { state.chart.destroy(); state.chart = null; }
  box.replaceChildren();
  if (!doc || !doc.x.length) { box.append(el('p', { class: 'empty', text: 'This run has no memory records yet.' })); return; }
  state.chart = drawChart(box, doc, { palette: COLORS, lines: state.lines, stackColor, width: box.clientWidth || 1000,
    selected: () => state.step,
    onClick: (step, mark) => { if (mark) openSnapshot(state.snapshots.find((s) => s.id === mark.id)); selectStep(step); } });
  box.dataset.drawn = String(doc.x.length);
}

// --- at a step ----------------------------------------------------------------------------
async function selectStep(step) {
  state.step = step;
  if (state.chart) state.chart.redraw();
  const run = state.run;
  const doc = await api('at', { run, step });
  if (run !== state.run) return;
  const box = document.getElementById('at-box');
  box.hidden = false;
  const c = doc.census;
  const r = doc.record;
  document.getElementById('at-title').textContent =
    `At step ${step}` + (c ? ` — census at step ${c.step}` : '') + (r ? `, record at step ${r.step}` : '');
  const census = document.getElementById('census');
  census.replaceChildren();
  if (c) {
    const total = Object.values(c.by_category).reduce((a, b) => a + b, 0);
    const rows = Object.entries(c.by_category).map(([k, v]) => [k, fmtBytes(v), total ? `${(100 * v / total).toFixed(1)}%` : '–']);
    if (c.unattributed_bytes != null) rows.push(['unattributed (device)', fmtBytes(c.unattributed_bytes), '']);
    rows.push(['total', fmtBytes(c.total_bytes ?? total), '']);
    census.append(el('h3', { text: `Census: bytes by category${c.approx ? ' (from the MB scalars)' : ''}` }));
    if (c.where) census.append(el('p', { class: 'hint', text: `Taken ${c.where}.` }));
    census.append(table(['category', 'bytes', 'share'], rows, 'census-table'));
    for (const b of ['dtype', 'device', 'module']) {
      const t = c[`by_${b}`] || {};
      if (Object.keys(t).length) census.append(el('h3', { text: `by ${b}` }), table([b, 'bytes'], Object.entries(t).sort((p, q) => q[1] - p[1]).map(([k, v]) => [k, fmtBytes(v)])));
    }
    // a note may say what the census does count (a blind spot's sentence): a 'Not counted:' label contradicted it
    if (c.notes && c.notes.length) {
      census.append(el('p', { class: 'hint', text: 'Blind spots and notes (memory the census cannot see, or counts without its owner):' }));
      const list = el('ul', { class: 'hint census-notes' });
      for (const n of c.notes) list.append(el('li', { text: n }));
      census.append(list);
    }
  } else census.append(el('p', { class: 'empty', text: 'This run has no census (MemoryWriter census_every > 0 takes one).' }));
  const readings = document.getElementById('readings');
  // memory is recorded every few steps, the loss often every step: a click between records shows the memory
  // record at or before it, and says which step that is
  const which = !r || r.step === step ? '' : r.step < step ? ` (the last one at or before step ${step})`
    : ` (the first one: none before step ${step})`;
  readings.replaceChildren(el('h3', { text: r ? `Readings of the record at step ${r.step}${which}` : 'No readings' }));
  if (r) readings.append(table(['tag', 'value'], r.readings.map((x) => [x.tag, fmtValue(x)]), 'readings-table'));
  const lossAt = r && r.losses_at_click;
  if (lossAt) {
    readings.append(el('h3', { text: `Loss at step ${lossAt.step}` }),
      table(['tag', 'value'], lossAt.readings.map((x) => [x.tag, fmtValue(x)]), 'click-loss-table'));
  }
  const top = document.getElementById('top');
  top.replaceChildren();
  if (c) {
    if (c.top) {
      const threshold = c.large_tensor_bytes != null ? ` of ${fmtBytes(c.large_tensor_bytes)}` : '';
      const rule = c.large_rule ? ` (${c.large_rule})` : '';
      const head = c.large_count != null ? `${c.large_count} storages (${fmtBytes(c.large_total_bytes)}) at or above the large-tensor threshold${threshold}${rule}` : '';
      top.append(el('h3', { text: `Largest tensors at step ${c.step}` + (head ? ` — ${head}` : '') }),
        table(['#', 'name', 'category', 'shape', 'dtype', 'device', 'bytes'],
          c.top.map((t, i) => [String(i + 1), t.name, t.category, t.shape.length ? t.shape.join('×') : 'scalar', t.dtype, t.device, fmtBytes(t.bytes)]),
          'top-table'));
    } else top.append(el('p', { class: 'hint', text: 'The largest tensors of this census were not kept (TensorBoard keeps 10 text summaries per tag; runs logged with this tbmem keep every census in plugins/tbmem/census.jsonl).' }));
  }
}

// --- snapshots ----------------------------------------------------------------------------
async function loadSnapshots() {
  const run = state.run;
  const list = await api('snapshots', { run });
  if (run !== state.run) return;
  state.snapshots = list;
  const box = document.getElementById('snapshots');
  if (!list.length) { box.replaceChildren(el('p', { class: 'empty', text: 'No snapshots in this run (MemoryWriter snapshot=..., or PyTorch snapshot pickles under the run folder).' })); return; }
  box.replaceChildren(table(['step', 'kind', 'rank', 'format', 'size', 'file', ''], list.map((s) => [
    s.step == null ? '?' : String(s.step), s.kind, s.rank == null ? '–' : String(s.rank), s.format, fmtBytes(s.size), s.name,
    el('button', { type: 'button', class: 'open', text: 'Open', onclick: () => openSnapshot(s) })]), 'snap-table'));
}

async function openSnapshot(s) {
  if (!s) return;
  const url = `snapshot?${new URLSearchParams({ run: state.run, id: s.id })}`;
  status(`opening ${s.name}…`);
  const check = await fetch(url);  // errors (a pickle naming Python objects, ...) are shown, not framed
  if (!check.ok) {
    const body = await check.json().catch(() => null);
    status((body && body.error) || `could not open ${s.name} (HTTP ${check.status})`);
    return;
  }
  status('');
  document.getElementById('viewer-title').textContent = `${s.kind} at step ${s.step ?? '?'}: ${s.name}`;
  document.getElementById('viewer').src = url;
  const box = document.getElementById('viewer-box');
  box.hidden = false;
  box.scrollIntoView({ block: 'nearest' });
}

function closeViewer() {
  document.getElementById('viewer-box').hidden = true;
  document.getElementById('viewer').removeAttribute('src');
}

// --- findings and ranks -------------------------------------------------------------------
async function loadFindings() {
  const run = state.run;
  const leaks = document.getElementById('leaks');
  const summary = document.getElementById('summary');
  leaks.replaceChildren(el('p', { class: 'hint', text: 'analysing…' }));
  summary.replaceChildren();
  let doc;
  try { doc = await api('findings', { run }); } catch (e) { leaks.replaceChildren(el('p', { class: 'error', text: String(e.message) })); return; }
  if (run !== state.run) return;
  leaks.replaceChildren();
  if (doc.leaks.length) {
    leaks.append(el('h3', { class: 'leak', text: `${doc.leaks.length} leak finding${doc.leaks.length > 1 ? 's' : ''}: memory grows steadily` }),
      el('ul', {}, ...doc.leaks.map((f) => el('li', { class: 'leak', text: f.evidence }))));
  } else leaks.append(el('p', { class: 'ok', text: 'No leak found: no memory tag grows steadily above its threshold.' }));
  if (doc.watched.length) {
    leaks.append(el('details', {}, el('summary', { text: `Trends of the ${doc.watched.length} other watched tags` }),
      table(['tag', 'slope (MB/1k steps)', '95% CI', 'threshold', 'window', 'points'], doc.watched.map((f) => [
        f.tag, f.slope_mb_per_1k.toFixed(2), `${f.low_mb_per_1k.toFixed(2)} .. ${f.high_mb_per_1k.toFixed(2)}`,
        String(f.threshold_mb_per_1k), `${f.start_step}..${f.end_step}`, String(f.n_points)]))));
  }
  if (doc.summary_text) summary.append(el('h3', { text: 'Run summary (tbmem report)' }), el('pre', { text: doc.summary_text }));
  else if (doc.summary_error) summary.append(el('p', { class: 'hint', text: doc.summary_error }));
}

async function loadRanks(group) {
  const doc = await api('ranks', { group });
  if (!doc.compact && doc.ranks.filter((r) => r.rank != null).length < 2) { document.getElementById('ranks-box').hidden = true; return; }
  const jobBox = document.getElementById('job-box');
  jobBox.replaceChildren();
  const all = doc.ranks;
  if (doc.compact && all.length > 20) {  // a thousand rows do not read: the 10 highest and the 10 lowest
    const key = (r) => r.peak_vram_allocated ?? r.peak_rss ?? 0;
    const order = [...all].sort((a, b) => key(b) - key(a));
    doc.ranks = [...order.slice(0, 10), ...order.slice(-10)];
  }
  const cols = [['peak_vram_allocated', 'peak VRAM allocated'], ['peak_vram_reserved', 'peak VRAM reserved'],
    ['peak_rss', 'peak RSS'], ['peak_census', 'census peak']].filter(([k]) => doc.ranks.some((r) => r[k] != null));
  const max = Object.fromEntries(cols.map(([k]) => [k, Math.max(...doc.ranks.map((r) => r[k] || 0))]));
  const cell = (r, k) => {
    if (r[k] == null) return '–';
    const bar = el('div', { class: 'bar' + (r[k] === max[k] ? ' max' : '') });
    bar.style.width = `${max[k] ? (100 * r[k] / max[k]).toFixed(1) : 0}%`;
    return el('div', { class: 'barcell' }, bar, el('span', { text: `${fmtBytes(r[k])} @ ${r[k + '_step']}` }));
  };
  document.getElementById('ranks').replaceChildren(table(['rank', ...cols.map(([, l]) => l)],
    doc.ranks.map((r) => [r.rank == null ? `${r.run} (aggregate)` : `rank ${r.rank}`, ...cols.map(([k]) => cell(r, k))]), 'ranks-table'));
  if (doc.compact) {
    const heat = el('div', { id: 'heat-box' });
    if (all.length > doc.ranks.length) jobBox.append(el('p', { class: 'hint', text: `${all.length} ranks in the job's rank tables: the 10 highest and 10 lowest shown above` }));
    jobBox.append(heat);
    await showJob(heat, group, all);
  }
}

// --- entry point --------------------------------------------------------------------------
export async function render() {
  layout();
  new ResizeObserver(() => {
    if (state.chart) state.chart.setWidth(document.getElementById('chart').clientWidth);
  }).observe(document.getElementById('chart'));
  try {
    await loadScript('static/uPlot.iife.min.js');
    await loadRuns();
  } catch (e) {
    status(`error: ${e.message}`);
  }
  state.profiles = profiles;
  window.tbmemMemoryTab = state;  // for tests and the curious
}
