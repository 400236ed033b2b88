// Small helpers of tbmem's Memory tab: DOM building (strings only ever set as textContent), number
// formats, the plugin's routes, and the tab's state in TensorBoard's address.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'text') node.textContent = v;
    else if (k === 'class') node.className = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c != null) node.append(c);
  return node;
}

export function fmtBytes(n) {
  if (n == null || !isFinite(n)) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = Math.abs(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  const s = (n < 0 ? '-' : '') + (i === 0 ? v.toFixed(0) : v.toFixed(v >= 100 ? 1 : 2));
  return `${s} ${units[i]}`;
}

// The labels of a byte axis: one unit for the whole axis (the largest tick's), with the decimals the tick
// step needs to be exact in it, or a smaller unit where that takes more than two (per tick, fmtBytes read
// 1.46 MiB / 1000.0 KiB / 500.0 KiB on one axis, and the same label five times on a narrow range).
export const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
export function fmtByteTicks(ticks) {
  const finite = ticks.filter((t) => t != null && isFinite(t));
  const sorted = [...new Set(finite)].sort((a, b) => a - b);
  if (sorted.length < 2) return ticks.map((t) => (t == null || !isFinite(t) ? '' : fmtBytes(t)));
  let step = Infinity;
  for (let i = 1; i < sorted.length; i++) step = Math.min(step, sorted[i] - sorted[i - 1]);
  const top = Math.max(...finite.map(Math.abs));
  let k = 0;
  while (k < BYTE_UNITS.length - 1 && top >= 1024 ** (k + 1)) k++;
  const exact = (v, d) => Math.abs(v * 10 ** d - Math.round(v * 10 ** d)) < 1e-6;
  let digits = 0;
  for (;;) {
    digits = 0;
    while (digits <= 2 && !finite.every((t) => exact(t / 1024 ** k, digits))) digits++;
    if (digits <= 2 || k === 0) break;
    k--;
  }
  if (k === 0) digits = 0;
  return ticks.map((t) => (t == null || !isFinite(t) ? '' : `${(t / 1024 ** k).toFixed(digits)} ${BYTE_UNITS[k]}`));
}

// A reading for a label: 4 significant digits, in exponent form below 0.001 and from a million on
// (a census category of a few KB in GB read 0.000003815).
export function fmtNumber(v) {
  if (v == null || !isFinite(v)) return '–';
  const a = Math.abs(v);
  if (a === 0) return '0';
  if (a < 1e-3 || a >= 1e6) return v.toExponential(2);
  return String(Number(v.toPrecision(4)));
}

export function fmtValue(row) {
  if (row.bytes != null) return fmtBytes(row.bytes);
  const v = row.value;
  const s = Math.abs(v) >= 1000 || Number.isInteger(v) ? String(Math.round(v * 100) / 100) : v.toPrecision(4);
  return row.unit ? `${s} ${row.unit}` : s;
}

export async function api(route, params = {}) {
  const response = await fetch(`${route}?${new URLSearchParams(params)}`);
  const body = await response.json().catch(() => null);
  if (!response.ok) throw new Error((body && body.error) || `${route}: HTTP ${response.status}`);
  return body;
}

export function loadScript(src) {
  return new Promise((resolve, reject) => {
    const s = el('script', { src });
    s.addEventListener('load', resolve);
    s.addEventListener('error', () => reject(new Error(`could not load ${src}`)));
    document.head.append(s);
  });
}

export function table(headers, rows, cls) {
  const t = el('table', { class: cls || '' });
  t.append(el('thead', {}, el('tr', {}, ...headers.map((h) => el('th', { text: h })))));
  const body = el('tbody');
  for (const r of rows) body.append(el('tr', {}, ...r.map((c) => (c instanceof Node ? el('td', {}, c) : el('td', { text: c ?? '–' })))));
  t.append(body);
  return t;
}

// --- the tab's state in the address -------------------------------------------------------------
// TensorBoard keeps a plugin's own settings in its address as `#tbmem&p.tbmem.<key>=<value>` (what its
// plugin API hands back as the plugin's URL data). The tab is framed by TensorBoard on the same origin,
// so it reads and replaces the parent's hash; without access to it (another origin) it uses its own.
const PREFIX = 'p.tbmem.';

function hashOwner() {
  try {
    if (window.parent !== window && window.parent.location.hash !== undefined) return window.parent;
  } catch (e) { /* another origin: keep the state in the tab's own address */ }
  return window;
}

function parseHash(hash) {
  const parts = hash.replace(/^#/, '').split('&').filter((p) => p);
  return parts.map((p) => {
    const i = p.indexOf('=');
    return i < 0 ? [decodeURIComponent(p), null] : [decodeURIComponent(p.slice(0, i)), decodeURIComponent(p.slice(i + 1))];
  });
}

export function urlState() {
  const out = {};
  for (const [k, v] of parseHash(hashOwner().location.hash)) if (k.startsWith(PREFIX) && v != null) out[k.slice(PREFIX.length)] = v;
  return out;
}

export function setUrlState(values) {
  const owner = hashOwner();
  const kept = parseHash(owner.location.hash).filter(([k]) => !(k.slice(PREFIX.length) in values && k.startsWith(PREFIX)));
  if (!kept.length || kept[0][1] != null) kept.unshift(['tbmem', null]);
  for (const [k, v] of Object.entries(values)) if (v != null) kept.push([PREFIX + k, String(v)]);
  const hash = '#' + kept.map(([k, v]) => (v == null ? encodeURIComponent(k) : `${encodeURIComponent(k)}=${encodeURIComponent(v)}`)).join('&');
  if (owner.location.hash !== hash) owner.history.replaceState(owner.history.state, '', hash);
}
