// The percolite console: polls the JSON API of the server that served it
// and draws what it gets. No framework, nothing fetched from elsewhere.
"use strict";

const TOKEN = document.querySelector('meta[name="percolite-token"]').content;
const REFRESH_MS = 2000;
let cellsCursor = null;
let shownTraceback = null;

function api(path, options = {}) {
  const headers = Object.assign({"X-Percolite-Token": TOKEN}, options.headers || {});
  return fetch(path, Object.assign({}, options, {headers, credentials: "same-origin"}))
    .then(async (response) => {
      const kind = response.headers.get("Content-Type") || "";
      const body = kind.startsWith("application/json") ? await response.json() : await response.text();
      if (!response.ok) throw new Error((body && body.error) || response.statusText);
      return body;
    });
}

function post(path, body) {
  return api(path, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    if (name === "text") node.textContent = value;
    else if (name === "onclick") node.addEventListener("click", value);
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function number(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value === "number" && !Number.isInteger(value)) return value.toFixed(1);
  return Number(value).toLocaleString("en");
}

function when(unix) {
  if (!unix) return "-";
  return new Date(unix * 1000).toLocaleString("sv").replace("T", " ");
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function say(text, bad = false) {
  const box = document.getElementById("message");
  box.textContent = text;
  box.className = bad ? "message bad" : "message";
  box.hidden = false;
  clearTimeout(say.timer);
  say.timer = setTimeout(() => { box.hidden = true; }, 6000);
}

function replaceBody(table, rows) {
  const body = table.tBodies[0];
  body.replaceChildren(...rows);
}

// -- status ------------------------------------------------------------------
// A store on a server: the server this console's handle reaches, and the
// reconnections and failovers every process recorded (the last of each in
// the tooltip, marked when there was a failover).
function serverSpans(server) {
  if (!server) return [];
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  const last = [];
  if (server.last_failover) {
    last.push(`last failover ${when(server.last_failover.unix)}: ${server.last_failover.servers}`);
  }
  if (server.last_reconnection) {
    last.push(`last reconnection ${when(server.last_reconnection.unix)}: ${server.last_reconnection.cause}`);
  }
  return [
    el("span", {id: "server", text: `server ${server.address}`}),
    el("span", {
      id: "reconnections",
      class: server.failovers ? "failed-over" : null,
      title: last.join("\n") || null,
      text: `${plural(server.reconnections, "reconnection")}, ${plural(server.failovers, "failover")}`,
    }),
  ];
}

function drawStatus(status) {
  const store = status.store;
  const identity = store.identity ? `${store.identity.store.slice(0, 12)}… epoch ${store.identity.epoch}` : "none yet";
  document.getElementById("store").replaceChildren(
    el("span", {class: "backend", text: store.backend}),
    el("span", {class: "location", text: store.location}),
    el("span", {text: `size ${bytes(store.size_bytes)}`}),
    el("span", {text: `identity ${identity}`}),
    el("span", {id: "app-name", text: `app ${store.app || "(none recorded)"}`}),
    ...serverSpans(status.server),
  );
  document.getElementById("pending-count").textContent = number(status.pending);
  document.getElementById("parked-count").textContent = number(status.parked);
  const live = status.groups.flatMap((g) => g.pools).filter((p) => p.live);
  document.getElementById("pool-count").textContent = `${live.length} pool${live.length === 1 ? "" : "s"}`;

  replaceBody(document.getElementById("observers"), status.observers.map((o) => el("tr",
    {"data-name": o.name, class: o.parked ? "has-parked" : (o.failures ? "has-failures" : null)},
    el("td", {class: "name", text: o.name}),
    el("td", {text: o.kind}),
    el("td", {class: "pending", text: number(o.pending)}),
    el("td", {text: number(o.running)}),
    el("td", {text: number(o.runs_per_second)}),
    el("td", {text: number(o.commits_per_second)}),
    el("td", {text: number(o.conflicts)}),
    el("td", {class: "failures", text: number(o.failures)}),
    el("td", {class: "parked", text: number(o.parked)}),
    el("td", {class: "depth", text: o.depth === null ? "" : number(o.depth)}),
    el("td", {class: `sink sink-${o.sink || "none"}`, text: o.sink || ""}),
    el("td", {class: "error", title: o.last_error_message || "",
      text: o.last_error_type ? `${o.last_error_type}: ${o.last_error_message}` : ""}),
  )));

  const groups = document.getElementById("groups");
  if (!status.groups.length) {
    groups.replaceChildren(el("p", {class: "quiet", text: "No worker pool holds a lease."}));
  } else {
    groups.replaceChildren(...status.groups.map((g) => el("div", {class: "group", "data-group": g.group},
      el("h3", {text: `group ${g.group}`}),
      el("table", {}, el("thead", {}, el("tr", {},
        ...["host", "pid", "threads", "partitions", "live", "last renewal", "expires in"].map((h) => el("th", {text: h})))),
        el("tbody", {}, ...g.pools.map((p) => el("tr", {"data-owner": p.owner, class: p.live ? null : "dead"},
          el("td", {text: p.host}), el("td", {text: p.pid}), el("td", {text: p.threads}),
          el("td", {text: p.partitions}), el("td", {text: p.live ? "yes" : "no"}),
          el("td", {text: when(p.renewed_unix)}), el("td", {text: `${p.expires_in} s`}))))),
    )));
  }

  const sinks = document.getElementById("sinks");
  const entries = Object.entries(status.sinks);
  if (!entries.length) {
    sinks.replaceChildren(el("p", {class: "quiet", text: "No export queue."}));
  } else {
    sinks.replaceChildren(el("table", {}, el("thead", {}, el("tr", {},
      ...["export queue", "state", "since", "entries waiting", "last error", ""].map((h) => el("th", {text: h})))),
      el("tbody", {}, ...entries.map(([queue, s]) => el("tr", {"data-sink": queue, class: `sink-${s.state}`},
        el("td", {text: queue}), el("td", {class: "state", text: s.state}), el("td", {text: when(s.since_unix)}),
        el("td", {text: number(s.waiting)}),
        el("td", {text: s.last_error ? `${s.last_error.type}: ${s.last_error.message}` : ""}),
        el("td", {}, s.state !== "refused" ? null : status.store.app_bound
          ? el("button", {class: "action take-over", onclick: () => takeOver(queue), text: "Take over"})
          : el("span", {class: "quiet", title: "serve the console with --app MODULE:APP to take it over here",
            text: "take-over needs --app"})))))));
  }

  const select = document.getElementById("cells-queue");
  const known = new Set([...select.options].map((o) => o.value));
  for (const o of status.observers) {
    if (o.kind === "combine queue" && !known.has(o.queue)) select.append(el("option", {value: o.queue, text: o.queue}));
  }
}

// -- charts --------------------------------------------------------------------
const SERIES = [
  ["pending", "pending notifications"],
  ["commits_per_second", "commits/s"],
  ["runs_per_second", "observer runs/s"],
  ["failures_per_second", "failures/s"],
  ["commit_latency_ms", "mean commit latency, ms"],
  ["transactions_per_sync", "transactions per sync"],
];
const SVG = "http://www.w3.org/2000/svg";

function chart(name, title, times, values) {
  const width = 300, height = 70, pad = 4;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("class", "chart");
  svg.setAttribute("data-series", name);
  const present = values.filter((v) => v !== null);
  const top = Math.max(1e-9, ...present);
  const first = times[0], span = Math.max(1, times[times.length - 1] - first);
  let d = "";
  values.forEach((v, i) => {
    if (v === null) return;
    const x = pad + ((times[i] - first) / span) * (width - 2 * pad);
    const y = height - pad - (v / top) * (height - 2 * pad);
    d += `${d ? "L" : "M"}${x.toFixed(1)} ${y.toFixed(1)} `;
  });
  const path = document.createElementNS(SVG, "path");
  path.setAttribute("d", d || `M${pad} ${height - pad}`);
  path.setAttribute("class", "line");
  svg.append(path);
  const last = present.length ? present[present.length - 1] : null;
  return el("figure", {class: "series"},
    el("figcaption", {}, el("span", {text: title}), el("b", {class: "now", text: number(last)}),
      el("span", {class: "quiet", text: ` max ${number(present.length ? top : null)}`})),
    svg);
}

function drawHistory(history) {
  const box = document.getElementById("charts");
  if (history.unix.length < 2) {
    box.replaceChildren(el("p", {class: "quiet", text: "Gathering samples…"}));
    return;
  }
  box.replaceChildren(...SERIES.map(([name, title]) => chart(name, title, history.unix, history[name])));
  // The headline is the chart's latest figure: the store's commits per second.
  const commits = history.commits_per_second;
  document.getElementById("commits-rate").textContent = number(commits[commits.length - 1]);
}

// -- failures and parked work -----------------------------------------------------
function drawWork(work) {
  const box = document.getElementById("failures");
  const traceback = document.getElementById("traceback");
  document.getElementById("work").append(traceback);  // out of the rows redrawn below
  const wanted = document.getElementById("parked-filter-name").value.trim().toLowerCase();
  const groups = work.groups.filter((g) => !wanted || g.observer.toLowerCase().includes(wanted));
  if (!groups.length) {
    box.replaceChildren(el("p", {class: "quiet", id: "no-work", text: "Nothing here."}));
    return;
  }
  box.replaceChildren(...groups.map((g) => el("div", {class: "work-group", "data-observer": g.observer},
    el("h3", {}, `${g.observer} `, el("span", {class: "count", text: `${g.count}`}),
      el("button", {class: "action retry-group", onclick: () => retry(g.queue ? {queue: g.queue} : {observer: g.observer}),
        text: g.queue ? `Retry queue ${g.queue}` : `Retry all of ${g.observer}`})),
    el("table", {}, el("thead", {}, el("tr", {},
      ...["cell or key", "attempts", "first failure", "last failure", "error", ""].map((h) => el("th", {text: h})))),
      el("tbody", {}, ...g.items.map((item) => el("tr", {class: "work-item", "data-item": item.item},
        el("td", {text: item.key !== null ? `key ${item.key}` : `${item.row} ${item.column.join(":")}`}),
        el("td", {text: item.attempts}),
        el("td", {text: when(item.first_failure_unix)}),
        el("td", {text: when(item.last_failure_unix)}),
        el("td", {}, el("a", {href: "#traceback", class: "show-traceback", onclick: (event) => {
          event.preventDefault();
          showTraceback(item);
        }, text: `${item.error.type}: ${item.error.message}`})),
        el("td", {}, item.parked ? el("button", {class: "action retry-item", onclick: () => retry({item: item.item}),
          text: "Retry"}) : el("span", {class: "quiet", text: "retrying"})))))),
  )));
  placeTraceback();
}

function showTraceback(item) {
  // Beside the row clicked: a row of its own under it, kept across refreshes.
  shownTraceback = item;
  placeTraceback();
  document.getElementById("traceback").scrollIntoView({block: "nearest"});
}

function placeTraceback() {
  const box = document.getElementById("traceback");
  const row = shownTraceback && document.querySelector(`tr.work-item[data-item="${CSS.escape(shownTraceback.item)}"]`);
  if (!row) { box.hidden = true; return; }
  box.textContent = shownTraceback.error.traceback || `${shownTraceback.error.type}: ${shownTraceback.error.message}`;
  box.hidden = false;
  const holder = el("tr", {class: "traceback-row"}, el("td", {colspan: "6"}));
  holder.firstChild.append(box);
  row.after(holder);
}

function retry(what) {
  post("/api/retry", what)
    .then((done) => { say(`Retried ${done.retried}: ${done.what}.`); refresh(); })
    .catch((e) => say(`Retry failed: ${e.message}`, true));
}

function takeOver(queue) {
  if (!confirm(`Make the sink of export queue ${queue} belong to this store? Its rows from the other store are deleted.`)) return;
  post("/api/take-over", {queue})
    .then((done) => { say(`Took over ${done.sink}: ${done.rows_cleared} rows cleared, ${done.retried} buckets retried.`); refresh(); })
    .catch((e) => say(`Take-over failed: ${e.message}`, true));
}

// -- cells ------------------------------------------------------------------------
function loadCells(after = null) {
  const params = new URLSearchParams();
  const value = (id) => document.getElementById(id).value;
  const queue = value("cells-queue");
  if (queue) params.set("queue", queue);
  if (value("cells-prefix")) params.set("prefix", value("cells-prefix"));
  if (!queue && value("cells-start")) params.set("start", value("cells-start"));
  if (!queue && value("cells-end")) params.set("end", value("cells-end"));
  params.set("form", value("cells-form-select"));
  params.set("limit", "20");
  if (after) params.set("after", after);
  api(`/api/cells?${params}`).then((page) => {
    const table = document.getElementById("cells");
    const heads = queue ? ["key", "value"] : ["row", "family", "qualifier", "value", "size"];
    table.tHead.replaceChildren(el("tr", {}, ...heads.map((h) => el("th", {text: h}))));
    const rows = queue ? page.values : page.cells;
    replaceBody(table, rows.map((c) => el("tr", {}, ...heads.map((h) => el("td", {class: h === "value" ? "value" : null, text: c[h]})))));
    cellsCursor = page.next;
    document.getElementById("cells-next").disabled = !page.next;
  }).catch((e) => say(`Cells: ${e.message}`, true));
}

// -- the loop -----------------------------------------------------------------------
function refresh() {
  const status = document.getElementById("parked-filter-status").value;
  return Promise.all([
    api("/api/status").then(drawStatus),
    api("/api/history").then(drawHistory),
    api("/api/graph.svg").then((svg) => { document.getElementById("graph").innerHTML = svg; }),
    api(`/api/parked?status=${status}`).then(drawWork),
  ]).then(() => {
    document.getElementById("live").className = "live";
  }).catch((e) => {
    document.getElementById("live").className = "live stale";
    document.getElementById("live").title = e.message;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("retry-all").addEventListener("click", () => retry({}));
  document.getElementById("parked-filter-status").addEventListener("change", refresh);
  document.getElementById("parked-filter-name").addEventListener("input", refresh);
  document.getElementById("cells-form").addEventListener("submit", (event) => { event.preventDefault(); loadCells(); });
  document.getElementById("cells-next").addEventListener("click", () => loadCells(cellsCursor));
  refresh();
  loadCells();
  setInterval(refresh, REFRESH_MS);
});
