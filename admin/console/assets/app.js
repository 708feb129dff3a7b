// Warren's web console: plain JavaScript, no build step. It talks to the
// admin API (/api/) with the session cookie and sends the session's CSRF
// token on every write. Every view polls only what it shows, and stops
// when another view replaces it.
"use strict";

// ?poll=MS polls faster or slower (the browser test uses 250).
const POLL_MS = Math.max(100, +new URLSearchParams(location.search).get("poll") || 2000);
const CHART_POINTS = 90;
const state = { csrf: "", user: "", admin: false, view: null };
// window.__warren: what the browser test and anyone curious can read.
const perf = (window.__warren = { renders: {} });

// ---- helpers ----

// h builds an element: h("td.n", {title: "x"}, child, "text", …).
function h(tag, attrs, ...kids) {
  const [, name, id, classes] = /^([a-z0-9]+)(?:#([\w-]+))?((?:\.[\w-]+)*)$/.exec(tag);
  const el = document.createElement(name);
  if (id) el.id = id;
  if (classes) el.className = classes.slice(1).replace(/\./g, " ");
  if (attrs && (typeof attrs !== "object" || attrs instanceof Node || Array.isArray(attrs))) {
    kids.unshift(attrs);
    attrs = null;
  }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "value") el.value = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat()) {
    if (k === null || k === undefined || k === false) continue;
    el.append(k instanceof Node ? k : String(k));
  }
  return el;
}

const fmt = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
const num = (v) => fmt.format(v || 0);
function bytes(n) {
  if (!n) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return fmt.format(n) + " " + u[i];
}
const enc = encodeURIComponent;

function toast(msg, bad) {
  const t = document.getElementById("toast");
  t.textContent = msg;
  t.className = bad ? "bad" : "";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.hidden = true), bad ? 8000 : 3000);
}

class APIError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || "HTTP " + status);
    this.status = status;
  }
}

// api calls the admin API; writes carry the CSRF token. A 401 sends the
// user to the login form.
async function api(method, path, body) {
  const opts = { method, headers: {}, credentials: "same-origin" };
  if (method !== "GET") opts.headers["X-CSRF-Token"] = state.csrf;
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = { error: { message: "HTTP " + r.status + ": " + text.slice(0, 200) } }; }
  if (r.status === 401 && !path.startsWith("/console/api/login")) {
    state.csrf = "";
    showLogin("Your session has ended: log in again.");
    throw new APIError(401, data);
  }
  if (!r.ok) throw new APIError(r.status, data);
  return data;
}

// act runs a write and says how it went.
async function act(what, fn) {
  try {
    const r = await fn();
    toast(what + ": done");
    return r;
  } catch (e) {
    if (e.status !== 401) toast(what + ": " + e.message, true);
    throw e;
  }
}

function confirmDo(question) { return window.confirm(question); }

// ---- charts ----

// RateChart keeps the last CHART_POINTS samples of some series and draws
// them with uPlot.
class RateChart {
  constructor(el, series, colors, title) {
    this.el = el;
    this.names = series;
    this.data = [[], ...series.map(() => [])];
    const width = Math.max(320, el.clientWidth || 600);
    this.plot = new uPlot({
      title, width, height: 200,
      // Fewer than two samples: the last minute, not uPlot's default span
      // of years around a single point.
      scales: { x: { time: true, range: (u, lo, hi) => {
        const xs = u.data[0], n = xs ? xs.length : 0;
        if (n > 1) return [lo, hi];
        const t = n ? xs[0] : Date.now() / 1000;
        return [t - 60, t];
      } },
        y: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.1)] } },
      axes: [{}, { size: 60 }],
      series: [{}, ...series.map((s, i) => ({ label: s, stroke: colors[i], width: 1.5, points: { show: false } }))],
    }, this.data, el);
    (perf.charts ||= {})[title] = this;
  }
  push(t, values) {
    this.data[0].push(t);
    values.forEach((v, i) => this.data[i + 1].push(v));
    if (this.data[0].length > CHART_POINTS) this.data.forEach((d) => d.shift());
    this.plot.setData(this.data);
  }
  resize() {
    const w = this.el.clientWidth;
    if (w > 0) this.plot.setSize({ width: w, height: 200 });
  }
  destroy() { this.plot.destroy(); }
}

const RATE_SERIES = ["publish", "deliver", "ack", "redeliver", "dead-letter"];
const RATE_COLORS = ["#2563eb", "#16a34a", "#9333ea", "#ea580c", "#c0262d"];

// Rater turns successive counter totals into per-second rates.
class Rater {
  constructor(keys) { this.keys = keys; this.prev = null; }
  next(t, obj) {
    const cur = this.keys.map((k) => obj[k] || 0);
    let out = null;
    if (this.prev) {
      const dt = (t - this.prev.t) || 1;
      out = cur.map((v, i) => Math.max(0, (v - this.prev.v[i]) / dt));
    }
    this.prev = { t, v: cur };
    return out;
  }
}
const TOTAL_KEYS = ["published_total", "delivered_total", "acked_total", "redelivered_total", "dead_lettered_total"];

// ---- views ----

// A view is a function(main, params) that draws and returns a cleanup.
// poll runs fn now and every POLL_MS until the view goes.
function poller(fn) {
  let stop = false, timer = null;
  const tick = async () => {
    if (stop) return;
    try { await fn(); } catch (e) { if (e.status !== 401) console.warn(e.message); }
    if (!stop) timer = setTimeout(tick, POLL_MS);
  };
  tick();
  return () => { stop = true; clearTimeout(timer); };
}

function card(label, value, extra) {
  return h("div.card", h("div.k", label), h("div.v", value), extra || null);
}

function meter(used, limit) {
  const pct = limit ? Math.min(100, (100 * used) / limit) : 0;
  const i = h("i");
  i.style.width = pct.toFixed(1) + "%";
  return h(pct > 80 ? "div.bar.hot" : "div.bar", i);
}

// The disk card: free space against --disk-free-limit (-1: off), and the
// alarm that blocks publishers while it is below.
function diskCard(o) {
  const limit = o.disk_free_limit_bytes > 0 ? "limit " + bytes(o.disk_free_limit_bytes) : "no limit";
  const c = card("Disk free", o.disk_total_bytes ? bytes(o.disk_free_bytes) : "unknown",
    h("div.muted", (o.disk_total_bytes ? "of " + bytes(o.disk_total_bytes) + ", " : "") + limit +
      (o.disk_alarm ? " — ALARM: publishers blocked" : "")),
    o.disk_total_bytes ? meter(o.disk_total_bytes - o.disk_free_bytes, o.disk_total_bytes) : null);
  c.dataset.diskAlarm = String(!!o.disk_alarm);
  if (o.disk_alarm) c.classList.add("alarm");
  return c;
}

function overview(main) {
  const t0 = performance.now();
  const cards = h("div.cards");
  const rateEl = h("div.chart"), qEl = h("div.chart");
  main.append(h("h1", "Overview"), cards, h("div.panel", rateEl), h("div.panel", qEl),
    h("p.legend-note", "Message rates per second, from the broker's counters, sampled every " + POLL_MS / 1000 + " s."));
  const rates = new RateChart(rateEl, RATE_SERIES, RATE_COLORS, "Messages per second");
  const queued = new RateChart(qEl, ["ready", "unacked"], ["#2563eb", "#ea580c"], "Queued messages");
  const rater = new Rater(TOTAL_KEYS);
  perf.overviewSamples = 0;
  let first = true;
  const onResize = () => { rates.resize(); queued.resize(); };
  window.addEventListener("resize", onResize);
  const stop = poller(async () => {
    const o = await api("GET", "/api/overview");
    const t = Date.now() / 1000;
    perf.overviewSamples = (perf.overviewSamples || 0) + 1;
    const r = rater.next(t, o);
    if (r) rates.push(t, r);
    queued.push(t, [o.ready, o.unacked]);
    const mem = o.memory_high_watermark_bytes;
    cards.replaceChildren(
      card("Queued messages", num(o.ready + o.unacked), h("div.muted", num(o.ready) + " ready, " + num(o.unacked) + " unacked")),
      card("Publish / s", num(r ? r[0] : o.rates.publish)),
      card("Deliver / s", num(r ? r[1] : o.rates.deliver)),
      card("Connections", num(o.connections), h("div.muted", num(o.channels) + " channels")),
      card("Queues", num(o.queues), h("div.muted", num(o.consumers) + " consumers")),
      card("Exchanges", num(o.exchanges)),
      // flow_blocked is on under either alarm: the disk card shows its own.
      card("Memory", bytes(o.stored_message_bytes),
        h("div.muted", mem ? "of " + bytes(mem) + " watermark" + (o.flow_blocked && !o.disk_alarm ? " — ALARM: publishers blocked" : "") : "no watermark"), meter(o.stored_message_bytes, mem)),
      diskCard(o),
      card("Version", o.version));
    if (first) {
      first = false;
      perf.renders.overview = performance.now() - t0;
      performance.mark("warren-overview-rendered");
    }
  });
  return () => { stop(); window.removeEventListener("resize", onResize); rates.destroy(); queued.destroy(); };
}

// ---- queues ----

const QCOLS = [
  ["name", "Name"], ["ready", "Ready", 1], ["unacked", "Unacked", 1], ["consumers", "Consumers", 1],
  ["rates.publish", "Publish/s", 1], ["rates.deliver", "Deliver/s", 1], ["rates.ack", "Ack/s", 1],
  ["rates.redeliver", "Redeliver/s", 1], ["rates.dead_letter", "Dead-letter/s", 1],
];
const qstate = { page: 1, size: 100, sort: "name", order: "asc", name: "" };

function queues(main) {
  const tbody = h("tbody");
  const info = h("span.muted");
  const pager = h("span.row");
  const filter = h("input", { type: "search", placeholder: "filter by name", value: qstate.name, id: "queue-filter" });
  const head = h("tr");
  const table = h("table#queues", h("thead", head), tbody);
  let timer = null, seq = 0;
  const drawHead = () => head.replaceChildren(...QCOLS.map(([k, label, n]) => {
    const on = qstate.sort === k;
    return h("th.sort" + (on ? ".on" : "") + (n ? ".n" : ""), {
      "data-sort": k,
      onclick: () => {
        if (qstate.sort === k) qstate.order = qstate.order === "asc" ? "desc" : "asc";
        else { qstate.sort = k; qstate.order = n ? "desc" : "asc"; }
        qstate.page = 1;
        load();
      },
    }, label + (on ? (qstate.order === "asc" ? " ▲" : " ▼") : ""));
  }));
  const load = async () => {
    const my = ++seq;
    const t0 = performance.now();
    const q = new URLSearchParams({ page: qstate.page, page_size: qstate.size, sort: qstate.sort, order: qstate.order });
    if (qstate.name) q.set("name", qstate.name);
    const p = await api("GET", "/api/queues?" + q);
    if (my !== seq) return;
    drawHead();
    tbody.replaceChildren(...p.items.map((x) => h("tr", { "data-queue": x.name },
      h("td", h("a", { href: "#/queue/" + enc(x.name) }, x.name)),
      h("td.n", num(x.ready)), h("td.n", num(x.unacked)), h("td.n", num(x.consumers)),
      h("td.n", num(x.rates.publish)), h("td.n", num(x.rates.deliver)), h("td.n", num(x.rates.ack)),
      h("td.n", num(x.rates.redeliver)), h("td.n", num(x.rates.dead_letter)))));
    info.textContent = num(p.filtered_count) + " of " + num(p.total_count) + " queues · page " + p.page + " of " + p.page_count;
    pager.replaceChildren(
      h("button", { type: "button", disabled: p.page <= 1, onclick: () => { qstate.page--; load(); } }, "‹ Prev"),
      h("button", { type: "button", disabled: p.page >= p.page_count, onclick: () => { qstate.page++; load(); } }, "Next ›"),
      h("select", { onchange: (e) => { qstate.size = +e.target.value; qstate.page = 1; load(); } },
        ...[25, 100, 250, 500].map((n) => h("option", { value: n, selected: n === qstate.size }, n + " / page"))));
    // Rendered: the rows are in the document; the next frame paints them.
    perf.renders.queues = performance.now() - t0;
    perf.queuesRows = p.items.length;
    requestAnimationFrame(() => {
      perf.renders.queuesFrame = performance.now() - t0;
      main.dataset.loaded = String(my);
    });
  };
  filter.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => { qstate.name = filter.value.trim(); qstate.page = 1; load(); }, 200);
  });
  const declare = h("form.row", { onsubmit: async (e) => {
    e.preventDefault();
    const f = e.target;
    let settings = {};
    try { settings = f.args.value.trim() ? JSON.parse(f.args.value) : {}; } catch (err) { toast("settings: not JSON: " + err.message, true); return; }
    await act("declare " + f.qname.value, () => api("PUT", "/api/queues/" + enc(f.qname.value), settings));
    f.reset();
    load();
  } }, h("input", { name: "qname", placeholder: "queue name", required: true }),
  h("input", { name: "args", placeholder: '{"dead_letter_exchange":"dlx","max_length":1000}', size: 44 }),
  h("button.primary", { type: "submit" }, "Declare queue"));
  main.append(h("h1", "Queues"), h("div.row", filter, info, pager), table, h("h2", "Declare a queue"), declare,
    h("p.legend-note", "Settings as in PUT /api/queues/{name} (spec/admin-api.yaml): durable, max_length, message_ttl_ms, dead_letter_exchange, delivery_limit…"));
  drawHead();
  const stop = poller(load);
  return () => { stop(); clearTimeout(timer); };
}

// ---- one queue ----

function kvTable(obj) {
  const rows = Object.entries(obj).filter(([, v]) => v !== undefined && v !== null && v !== "" && typeof v !== "object");
  if (!rows.length) return h("p.muted", "none");
  return h("table.kv", h("tbody", ...rows.map(([k, v]) => h("tr", h("td", k), h("td", String(v))))));
}

// The death reasons' numbers (wire.DeathReason).
const DEATH_REASONS = ["", "rejected", "expired", "maxlen", "delivery_limit"];
const when = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "");

function messageView(m, i, selectable) {
  const p = m.properties || {};
  let body;
  try { body = atob(m.body || ""); } catch (e) { body = m.body; }
  const deaths = p.deaths || [];
  return h("div.msg", { "data-message": i },
    h("div.row", selectable ? h("input", { type: "checkbox", "data-index": i, "data-id": m.id }) : null,
      h("strong", "#" + (i + 1)),
      h("span.muted", "exchange " + (m.exchange || "(default)") + " · key " + m.routing_key + " · delivered " + m.delivery_count + "× · failed " + m.failed_count + "×")),
    h("pre", body),
    Object.keys(p).some((k) => k !== "deaths") ? h("pre.muted", JSON.stringify(Object.fromEntries(Object.entries(p).filter(([k]) => k !== "deaths")))) : null,
    deaths.length ? h("table.deaths",
      h("thead", h("tr", ...["reason", "queue", "exchange", "routing keys", "count", "first", "last"].map((x) => h("th", x)))),
      h("tbody", ...deaths.map((d) => h("tr", h("td", DEATH_REASONS[d.reason] || "reason " + d.reason), h("td", d.queue), h("td", d.exchange || "(default)"),
        h("td", (d.routing_keys || []).join(", ")), h("td", d.count), h("td", when(d.first_ms)), h("td", when(d.last_ms)))))) : null);
}

function peekPanel(name, selectable, extra) {
  const out = h("div#peeked");
  const form = h("form.row", { onsubmit: async (e) => {
    e.preventDefault();
    const n = +e.target.count.value;
    const r = await act("peek " + name, () => api("POST", "/api/queues/" + enc(name) + "/get", { count: n }));
    out.replaceChildren(r.messages.length ? h("div", ...r.messages.map((m, i) => messageView(m, i, selectable))) : h("p.muted", "no ready messages"));
  } }, h("label", "Look at the first ", h("input", { name: "count", type: "number", min: 1, max: 10000, value: 10, style: "width:80px" }), " ready messages "),
  h("button", { type: "submit", id: "peek" }, "Peek"), h("span.muted", "(nothing is taken or counted)"), extra || null);
  return h("div.panel", form, out);
}

function queuePage(main, name) {
  const cards = h("div.cards"), argsEl = h("div"), bindEl = h("div"), consEl = h("div");
  const chartEl = h("div.chart");
  main.append(h("h1", "Queue ", h("code", name)), cards, h("div.panel", chartEl),
    h("div.row",
      h("button.danger", { type: "button", id: "purge", onclick: async () => {
        if (!confirmDo("Purge every ready message of " + name + "?")) return;
        const r = await act("purge " + name, () => api("POST", "/api/queues/" + enc(name) + "/purge"));
        main.dataset.purged = String(r.purged);
        toast("purged " + r.purged + " messages");
      } }, "Purge"),
      h("button.danger", { type: "button", id: "delete", onclick: async () => {
        if (!confirmDo("Delete queue " + name + " and its messages?")) return;
        await act("delete " + name, () => api("DELETE", "/api/queues/" + enc(name)));
        location.hash = "#/queues";
      } }, "Delete"),
      h("a", { href: "#/publish?exchange=amq.default&routing_key=" + enc(name) }, "Publish to it")),
    h("h2", "Messages"), peekPanel(name, false),
    h("h2", "Arguments"), argsEl, h("h2", "Bindings"), bindEl, h("h2", "Consumers"), consEl);
  const chart = new RateChart(chartEl, RATE_SERIES, RATE_COLORS, "Messages per second");
  const rater = new Rater(TOTAL_KEYS);
  let static_ = false;
  const stop = poller(async () => {
    const q = await api("GET", "/api/queues/" + enc(name));
    const t = Date.now() / 1000;
    const r = rater.next(t, q);
    if (r) chart.push(t, r);
    cards.replaceChildren(card("Ready", num(q.ready)), card("Unacked", num(q.unacked)), card("Consumers", num(q.consumers)),
      card("Published", num(q.published_total)), card("Redelivered", num(q.redelivered_total)),
      card("Dead-lettered", num(q.dead_lettered_total), q.dead_letter_dropped_total ? h("div.muted", num(q.dead_letter_dropped_total) + " dropped") : null));
    cards.dataset.ready = String(q.ready);
    const [bs, chans] = await Promise.all([api("GET", "/api/bindings"), api("GET", "/api/channels")]);
    if (!static_) {
      static_ = true;
      const settings = {};
      for (const [k, v] of Object.entries(q)) {
        if (!["name", "ready", "unacked", "consumers", "rates"].includes(k) && !k.endsWith("_total")) settings[k] = v;
      }
      argsEl.replaceChildren(kvTable(settings));
    }
    const mine = bs.filter((b) => b.queue === name);
    bindEl.replaceChildren(mine.length ? h("table", h("thead", h("tr", h("th", "From exchange"), h("th", "Routing key"), h("th", "Arguments"))),
      h("tbody", ...mine.map((b) => h("tr", h("td", b.exchange || "(default)"), h("td", b.routing_key), h("td", b.arguments ? JSON.stringify(b.arguments) : ""))))) : h("p.muted", "no bindings but the default exchange's"));
    const cons = [];
    for (const c of chans) for (const x of c.consumers) if (x.queue === name) cons.push([c, x]);
    consEl.replaceChildren(cons.length ? h("table", h("thead", h("tr", h("th", "Tag"), h("th", "Connection"), h("th", "Channel"), h("th", "User"), h("th", "Ack"))),
      h("tbody", ...cons.map(([c, x]) => h("tr", h("td", x.tag), h("td", c.connection), h("td", c.channel), h("td", c.user), h("td", x.auto_ack ? "auto" : "manual"))))) : h("p.muted", "no consumers"));
  });
  return () => { stop(); chart.destroy(); };
}

// ---- exchanges and bindings ----

function exchanges(main) {
  const exEl = h("div"), bEl = h("div");
  const load = async () => {
    const [exs, bs] = await Promise.all([api("GET", "/api/exchanges"), api("GET", "/api/bindings")]);
    exEl.replaceChildren(h("table#exchanges", h("thead", h("tr", ...["Name", "Type", "Flags", "Alternate", ""].map((x) => h("th", x)))),
      h("tbody", ...exs.map((x) => h("tr", { "data-exchange": x.name }, h("td", x.name || "(default)"), h("td", x.type),
        h("td", [x.durable && "durable", x.auto_delete && "auto-delete", x.internal && "internal"].filter(Boolean).join(", ")),
        h("td", x.alternate_exchange || ""),
        h("td", x.name && !x.name.startsWith("amq.") ? h("button.danger", { type: "button", onclick: async () => {
          if (!confirmDo("Delete exchange " + x.name + "?")) return;
          await act("delete exchange " + x.name, () => api("DELETE", "/api/exchanges/" + enc(x.name)));
          load();
        } }, "Delete") : ""))))));
    bEl.replaceChildren(bs.length ? h("table#bindings", h("thead", h("tr", ...["Exchange", "Destination", "Routing key", "Arguments", ""].map((x) => h("th", x)))),
      h("tbody", ...bs.map((b) => h("tr", h("td", b.exchange), h("td", b.queue ? h("a", { href: "#/queue/" + enc(b.queue) }, "queue " + b.queue) : "exchange " + b.destination_exchange),
        h("td", b.routing_key), h("td", b.arguments ? JSON.stringify(b.arguments) : ""),
        h("td", h("button", { type: "button", onclick: async () => {
          await act("unbind", () => api("DELETE", "/api/bindings", b));
          load();
        } }, "Unbind")))))) : h("p.muted", "no bindings"));
  };
  const declare = h("form.row", { onsubmit: async (e) => {
    e.preventDefault();
    const f = e.target;
    await act("declare exchange " + f.xname.value, () => api("PUT", "/api/exchanges/" + enc(f.xname.value), { type: f.type.value, durable: f.durable.checked }));
    f.reset();
    load();
  } }, h("input", { name: "xname", placeholder: "exchange name", required: true }),
  h("select", { name: "type" }, ...["direct", "topic", "fanout", "headers", "consistent-hash"].map((t) => h("option", t))),
  h("label", h("input", { type: "checkbox", name: "durable" }), " durable"),
  h("button.primary", { type: "submit" }, "Declare exchange"));
  const bind = h("form.row", { onsubmit: async (e) => {
    e.preventDefault();
    const f = e.target;
    const b = { exchange: f.source.value, routing_key: f.key.value };
    if (f.kind.value === "queue") b.queue = f.dest.value; else b.destination_exchange = f.dest.value;
    if (f.bargs.value.trim()) {
      try { b.arguments = JSON.parse(f.bargs.value); } catch (err) { toast("arguments: not JSON: " + err.message, true); return; }
    }
    await act("bind", () => api("PUT", "/api/bindings", b));
    load();
  } }, h("input", { name: "source", placeholder: "from exchange", required: true }),
  h("select", { name: "kind" }, h("option", { value: "queue" }, "to queue"), h("option", { value: "exchange" }, "to exchange")),
  h("input", { name: "dest", placeholder: "destination", required: true }),
  h("input", { name: "key", placeholder: "routing key" }),
  h("input", { name: "bargs", placeholder: '{"x-match":"all"}' }),
  h("button.primary", { type: "submit" }, "Bind"));
  main.append(h("h1", "Exchanges"), exEl, h("h2", "Declare an exchange"), declare, h("h2", "Bindings"), bEl, h("h2", "Bind"), bind);
  return poller(load);
}

// ---- connections and channels ----

function connections(main) {
  const cEl = h("div"), chEl = h("div");
  main.append(h("h1", "Connections"), cEl, h("h2", "Channels"), chEl);
  return poller(async () => {
    const [cs, chans] = await Promise.all([api("GET", "/api/connections"), api("GET", "/api/channels")]);
    cEl.replaceChildren(cs.length ? h("table#connections", h("thead", h("tr", ...["Id", "Remote", "User", "Channels", "Blocked", "Outbound", "Auto-acks held", ""].map((x) => h("th", x)))),
      h("tbody", ...cs.map((c) => h("tr", { "data-connection": c.id }, h("td", c.id), h("td", c.remote), h("td", c.user), h("td.n", c.channels),
        h("td", c.blocked ? "blocked" : ""), h("td.n", bytes(c.outbound_bytes)), h("td.n", c.auto_acks_held),
        h("td", h("button.danger", { type: "button", onclick: async () => {
          if (!confirmDo("Close connection " + c.id + " (" + c.remote + ")?")) return;
          await act("close connection " + c.id, () => api("DELETE", "/api/connections/" + c.id));
        } }, "Close")))))) : h("p.muted", "no connections"));
    chEl.replaceChildren(chans.length ? h("table#channels", h("thead", h("tr", ...["Connection", "Channel", "User", "Unacked", "Consumers"].map((x) => h("th", x)))),
      h("tbody", ...chans.map((c) => h("tr", h("td", c.connection), h("td", c.channel), h("td", c.user), h("td.n", c.unacked),
        h("td", c.consumers.map((x) => x.tag + " → " + x.queue).join(", ") || "—"))))) : h("p.muted", "no channels"));
  });
}

// ---- users ----

// The broker's users (an administrator's page: the API refuses others).
// The form makes a user or replaces one (a password is always given); a
// row's Delete removes it and closes its connections. Each row shows the
// user's permissions in vhost "/" (the only one); the second form sets
// them (an invalid pattern: the server's error, as it says it), a row's
// Clear removes them.
function users(main) {
  const listEl = h("div");
  const form = h("form#user-form.row", { onsubmit: async (e) => {
    e.preventDefault();
    const field = (n) => e.target.elements.namedItem(n);
    const name = field("name").value, tags = field("tags").value.split(",").map((t) => t.trim()).filter(Boolean);
    await act("user " + name, () => api("PUT", "/api/users/" + enc(name), { password: field("password").value, tags }));
    field("password").value = "";
    load();
  } },
  h("input", { name: "name", placeholder: "name", required: true }),
  h("input", { name: "password", type: "password", placeholder: "password", required: true, autocomplete: "new-password" }),
  h("input", { name: "tags", placeholder: "tags, e.g. administrator, monitoring" }),
  h("button.primary", { type: "submit" }, "Create or replace"));
  const permErr = h("p#perm-error.error", { hidden: true });
  const permForm = h("form#perm-form.row", { onsubmit: async (e) => {
    e.preventDefault();
    const field = (n) => e.target.elements.namedItem(n).value;
    const name = field("user");
    try {
      await act("permissions of " + name, () => api("PUT", "/api/permissions/%2F/" + enc(name),
        { configure: field("configure"), write: field("write"), read: field("read") }));
      permErr.hidden = true;
    } catch (err) {
      permErr.textContent = err.message;
      permErr.hidden = false;
      return;
    }
    load();
  } },
  h("input", { name: "user", placeholder: "user", required: true }),
  ...["configure", "write", "read"].map((k) => h("input.mono", { name: k, placeholder: k + " regexp" })),
  h("button.primary", { type: "submit" }, "Set"));
  main.append(h("h1", "Users"), listEl, h("h2", "Create a user, or set one's password and tags"), form,
    h("h2", "Set a user's permissions in vhost /"),
    h("p.muted", "Regular expressions (Go RE2) over queue and exchange names: configure to declare and delete, write to publish and bind to, read to consume, get, purge and bind from; the default exchange is amq.default; empty matches nothing. Administrators may do anything."),
    permForm, permErr);
  const load = async () => {
    let us, ps;
    try {
      [us, ps] = await Promise.all([api("GET", "/api/users"), api("GET", "/api/permissions")]);
    } catch (e) {
      listEl.replaceChildren(h("p.muted", e.status === 403 ? "Only an administrator sees the users." : e.message));
      return;
    }
    const perms = new Map(ps.filter((p) => p.vhost === "/").map((p) => [p.user, p]));
    const pat = (p, k) => h("td.mono", { "data-perm": k, title: p ? "" : "no permissions in /" }, !p ? "—" : p[k] === "" ? h("span.muted", "(nothing)") : p[k]);
    listEl.replaceChildren(h("table#users", h("thead", h("tr", ...["Name", "Tags", "Configure", "Write", "Read", ""].map((x) => h("th", x)))),
      h("tbody", ...us.map((u) => { const p = perms.get(u.name); return h("tr", { "data-user": u.name }, h("td", u.name), h("td", (u.tags || []).join(", ")),
        pat(p, "configure"), pat(p, "write"), pat(p, "read"),
        h("td", h("button", { type: "button", title: "Fill the permissions form", onclick: () => {
          const f = permForm.elements;
          f.namedItem("user").value = u.name;
          for (const k of ["configure", "write", "read"]) f.namedItem(k).value = p ? p[k] : "";
        } }, "Edit permissions"), " ",
        p && h("button.clear-perms", { type: "button", onclick: async () => {
          if (!confirmDo("Clear the permissions of " + u.name + " in /? It may then do nothing there.")) return;
          await act("clear permissions of " + u.name, () => api("DELETE", "/api/permissions/%2F/" + enc(u.name)));
          load();
        } }, "Clear permissions"), " ",
        h("button.danger", { type: "button", onclick: async () => {
          if (!confirmDo("Delete user " + u.name + "? Its connections are closed.")) return;
          await act("delete user " + u.name, () => api("DELETE", "/api/users/" + enc(u.name)));
          load();
        } }, "Delete"))); }))));
    main.dataset.loaded = "1";
  };
  load();
  return () => {};
}

// ---- dead letters ----

// The dead-letter queues offered are those bound from the dead-letter
// exchanges of the queues that dead-letter most (the first 500), and any
// queue named by hand.
async function findDLQs() {
  const p = await api("GET", "/api/queues?page=1&page_size=500&sort=dead_lettered_total&order=desc");
  const dlx = new Set(p.items.filter((q) => q.dead_letter_exchange !== undefined).map((q) => q.dead_letter_exchange));
  const bs = await api("GET", "/api/bindings");
  return [...new Set(bs.filter((b) => dlx.has(b.exchange) && b.queue).map((b) => b.queue))].sort();
}

function deadLetters(main, params) {
  const list = h("div.row");
  const pane = h("div");
  const pick = (name) => {
    location.hash = "#/dead-letters?queue=" + enc(name);
  };
  const form = h("form.row", { onsubmit: (e) => { e.preventDefault(); pick(e.target.dlq.value); } },
    h("input", { name: "dlq", placeholder: "dead-letter queue", value: params.get("queue") || "", required: true }),
    h("button", { type: "submit" }, "Open"));
  main.append(h("h1", "Dead letters"), list, form, pane);
  findDLQs().then((qs) => list.replaceChildren(h("span.muted", "Dead-letter queues: "),
    ...(qs.length ? qs.map((q) => h("a", { href: "#/dead-letters?queue=" + enc(q), "data-dlq": q }, q)) : [h("span.muted", "none found")])))
    .catch(() => {});
  const name = params.get("queue");
  if (!name) return () => {};
  const count = h("strong#dlq-ready");
  const rate = h("input", { type: "number", min: 0, value: 100, style: "width:80px", id: "replay-rate" });
  // ids: the chosen messages (as the peek shows them); none: all.
  const replay = async (ids) => {
    const body = ids ? { ids, rate: +rate.value || 0 } : { count: 0, rate: +rate.value || 0 };
    const r = await act("replay", () => api("POST", "/api/queues/" + enc(name) + "/replay", body));
    pane.dataset.replayed = String((+pane.dataset.replayed || 0) + r.moved);
    pane.querySelector("#peek").click();
    toast("replayed " + r.moved + (r.skipped ? ", skipped " + r.skipped + " without death history" : "") +
      (r.missing ? ", " + r.missing + " no longer in the queue" : "") + (r.error ? " — stopped: " + r.error : ""), !!r.error);
  };
  pane.append(h("h2", "Queue ", h("a", { href: "#/queue/" + enc(name) }, name), " · ", count, " ready"),
    h("div.row",
      h("label", "Rate ", rate, " msg/s (0: unlimited)"),
      h("button", { type: "button", id: "replay-selected", onclick: () => {
        const ids = [...pane.querySelectorAll("input[data-id]:checked")].map((b) => +b.dataset.id);
        if (!ids.length) { toast("select the messages to replay", true); return; }
        replay(ids);
      } }, "Replay selected"),
      h("button.primary", { type: "button", id: "replay-all", onclick: () => {
        if (confirmDo("Replay every message of " + name + " to where it died from?")) replay(null);
      } }, "Replay all")),
    h("p.legend-note", "Each message goes back to the exchange and routing key it died from (its newest death record), and leaves this queue only once its republish is confirmed. Replay selected takes the messages ticked below, wherever they are among the first 10,000; the ones ahead of them are held meanwhile and go back in their order (their failed count rises by one)."),
    peekPanel(name, true));
  const stop = poller(async () => {
    const q = await api("GET", "/api/queues/" + enc(name));
    count.textContent = num(q.ready);
  });
  return stop;
}

// ---- publish ----

function publish(main, params) {
  const result = h("div#publish-result");
  const form = h("form", { onsubmit: async (e) => {
    e.preventDefault();
    const f = e.target;
    const body = { routing_key: f.key.value, payload: f.payload.value };
    const props = {};
    if (f.ctype.value) props.content_type = f.ctype.value;
    if (f.mid.value) props.message_id = f.mid.value;
    if (Object.keys(props).length) body.properties = props;
    if (f.prio.value) body.priority = +f.prio.value;
    const r = await act("publish", () => api("POST", "/api/exchanges/" + enc(f.exchange.value || "amq.default") + "/publish", body));
    result.textContent = r.routed ? "Routed to " + r.queues + (r.queues === 1 ? " queue." : " queues.") : "Not routed: no queue took it (it was dropped).";
    result.dataset.routed = String(r.routed);
  } },
  h("div.row", h("label", "Exchange ", h("input", { name: "exchange", value: params.get("exchange") || "amq.default", list: "exchange-names" })),
    h("datalist#exchange-names"),
    h("label", "Routing key ", h("input", { name: "key", value: params.get("routing_key") || "" }))),
  h("div.row", h("label", "Content type ", h("input", { name: "ctype", value: "text/plain" })),
    h("label", "Message id ", h("input", { name: "mid" })),
    h("label", "Priority ", h("input", { name: "prio", type: "number", min: 0, max: 255, style: "width:70px" }))),
  h("textarea", { name: "payload", placeholder: "payload" }),
  h("div.row", h("button.primary", { type: "submit", id: "publish" }, "Publish"), result));
  main.append(h("h1", "Publish a test message"), h("div.panel", form),
    h("p.legend-note", "Routed through the broker as a confirmed publish: the answer comes once every queue it went to has it. amq.default is the default exchange (the routing key names the queue)."));
  api("GET", "/api/exchanges").then((xs) => form.querySelector("#exchange-names").replaceChildren(
    ...xs.map((x) => h("option", { value: x.name || "amq.default" })))).catch(() => {});
  return () => {};
}

// ---- login and routing ----

function showLogin(msg) {
  if (state.view) { state.view(); state.view = null; }
  document.getElementById("top").hidden = true;
  const main = document.getElementById("main");
  const err = h("p.muted", msg || "");
  main.replaceChildren(h("form#login.login", { onsubmit: async (e) => {
    e.preventDefault();
    const f = e.target;
    try {
      const s = await api("POST", "/console/api/login", { user: f.user.value, password: f.password.value });
      started(s);
    } catch (x) { err.textContent = x.message; }
  } }, h("h1", "Warren"), h("label", "User", h("input", { name: "user", autocomplete: "username", required: true })),
  h("label", "Password", h("input", { name: "password", type: "password", autocomplete: "current-password" })),
  h("button.primary", { type: "submit" }, "Log in"), err));
}

function started(s) {
  state.csrf = s.csrf_token;
  state.user = s.user;
  state.admin = s.administrator;
  document.getElementById("top").hidden = false;
  document.getElementById("who").textContent = s.user + (s.administrator ? "" : " (read-only)");
  route();
}

const ROUTES = { overview, queues, exchanges, connections, "dead-letters": deadLetters, publish, users };

function route() {
  if (!state.csrf) return;
  const hash = location.hash.slice(1) || "/overview";
  const [pathPart, query] = hash.split("?");
  const parts = pathPart.split("/").filter(Boolean);
  const params = new URLSearchParams(query || "");
  if (state.view) { state.view(); state.view = null; }
  const main = document.getElementById("main");
  main.replaceChildren();
  delete main.dataset.loaded;
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("on", a.getAttribute("href") === "#/" + (parts[0] === "queue" ? "queues" : parts[0]));
  if (parts[0] === "queue" && parts[1]) state.view = queuePage(main, decodeURIComponent(parts.slice(1).join("/")));
  else state.view = (ROUTES[parts[0]] || overview)(main, params);
  document.title = "Warren · " + (parts[0] || "overview");
}

window.addEventListener("hashchange", route);
document.getElementById("logout").addEventListener("click", async () => {
  await api("POST", "/console/api/logout").catch(() => {});
  state.csrf = "";
  showLogin("Logged out.");
});
api("GET", "/console/api/session").then((s) => (s.user ? started(s) : showLogin())).catch((e) => showLogin(e.message));
