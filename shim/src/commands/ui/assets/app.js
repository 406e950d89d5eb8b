// runlock ui: polls /api/state and redraws. Every string from the store goes
// into the page as text (textContent), never as markup: hosts, keys and
// commands are written by whoever holds a key.
"use strict";

const POLL_MS = 2000;
const POLL_MAX_MS = 30000;
// A listing that does not answer in this long counts as failed.
const ANSWER_LIMIT_MS = 30000;

const ENDINGS = [
  ["held", "held now"],
  ["released", "released"],
  ["crashed", "crashed (client gone)"],
  ["expired", "expired"],
  ["forced", "forced or broken"],
  ["lost", "lost"],
  ["unknown", "end not recorded"],
];

let lastUpdate = null; // Date of the last good answer
// The token comes in the page's address and goes with each request for the
// state (no cookie: a browser would send it to every port of 127.0.0.1).
const STATE_URL = "/api/state?token=" +
  encodeURIComponent(new URLSearchParams(location.search).get("token") || "");

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function pad(n) {
  return String(n).padStart(2, "0");
}

function clock(ms) {
  const d = new Date(ms);
  return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
}

function span(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}

function drawLegend() {
  const legend = document.getElementById("legend");
  for (const [ending, name] of ENDINGS) {
    const item = el("li");
    item.append(el("span", "swatch ending-" + ending), el("span", null, name));
    legend.append(item);
  }
  const refusal = el("li");
  refusal.append(el("span", "swatch refusal"), el("span", null, "refused (held)"));
  legend.append(refusal);
}

function drawHeld(state) {
  const body = document.querySelector("#held tbody");
  const rows = [];
  for (const key of state.keys) {
    if (key.state !== "held") continue;
    const slots = key.slots ? key.holders.length + "/" + key.slots : "";
    key.holders.forEach((h, i) => {
      const row = el("tr", i === 0 ? "key" : "slot");
      row.dataset.key = key.key;
      const label = i === 0 ? key.key : "slot " + h.slot;
      const cells = [
        [label, "key"],
        [i === 0 ? slots : "", "num"],
        [h.host],
        [h.user],
        [h.pid, "num"],
        [clock(h.acquired_at_ms) + " (" + span(state.now_ms - h.acquired_at_ms) + " ago)"],
        [i === 0 ? (key.expires_in_ms == null ? "-" : span(key.expires_in_ms)) : ""],
        [h.command, "command"],
        [i === 0 && key.waiters.length > 0 ? key.waiters.length : "", "num waiting"],
      ];
      for (const [text, cls] of cells) row.append(el("td", cls, text));
      if (i === 0 && key.waiters.length > 0) {
        row.lastChild.title = key.waiters
          .map((w) => w.user + "@" + w.host + " (pid " + w.pid + ") for " + span(state.now_ms - w.since_ms))
          .join("\n");
      }
      rows.push(row);
    });
  }
  body.replaceChildren(...rows);
  document.getElementById("held-empty").hidden = rows.length > 0;
  const unreadable = state.keys
    .filter((k) => k.state === "unreadable")
    .map((k) => el("li", null, "unreadable record " + k.key + ": " + (k.unreadable || "")));
  document.getElementById("unreadable").replaceChildren(...unreadable);
}

// Percent of the window from its start; kept fine-grained so that a bar
// visibly grows, and an observer can tell, between two polls.
function percent(ms, state) {
  const width = state.now_ms - state.since_ms;
  const at = Math.min(Math.max(ms, state.since_ms), state.now_ms);
  return ((at - state.since_ms) * 100) / width;
}

function drawAxis(state) {
  const marks = [];
  const start = el("span", "axis-mark start", "−24h");
  start.style.left = "0%";
  marks.push(start);
  const hour = 3600 * 1000;
  const first = Math.ceil(state.since_ms / (3 * hour)) * 3 * hour;
  for (let t = first; t < state.now_ms - 1.5 * hour; t += 3 * hour) {
    if (t - state.since_ms < 1.5 * hour) continue;
    const mark = el("span", "axis-mark", clock(t).slice(0, 5));
    mark.style.left = percent(t, state).toFixed(5) + "%";
    marks.push(mark);
  }
  const now = el("span", "axis-mark now", "now " + clock(state.now_ms));
  now.style.left = "100%";
  marks.push(now);
  document.getElementById("axis").replaceChildren(...marks);
}

function drawTimeline(state) {
  drawAxis(state);
  const rows = [];
  for (const key of state.keys) {
    if (key.runs.length === 0 && key.refusals.length === 0) continue;
    const row = el("div", "tl-row");
    row.dataset.key = key.key;
    const label = el("div", "tl-label", key.key);
    label.title = key.key;
    const track = el("div", "tl-track");
    const laneCount = Math.max(key.slots || 1, ...key.runs.map((r) => (r.slot || 0) + 1));
    if (laneCount > 1) track.classList.add("lanes-many");
    const lanes = [];
    for (let i = 0; i < laneCount; i++) lanes.push(el("div", "lane"));
    for (const run of key.runs) {
      const end = run.end_ms == null ? state.now_ms : run.end_ms;
      const startMs = run.start_ms == null ? state.since_ms : run.start_ms;
      const left = percent(startMs, state);
      const bar = el("div", "bar ending-" + run.ending);
      if (run.end_ms == null) bar.classList.add("open");
      if (run.start_ms == null || run.start_ms < state.since_ms) bar.classList.add("before");
      bar.dataset.ending = run.ending;
      bar.dataset.token = run.token;
      if (run.slot != null) bar.dataset.slot = run.slot;
      bar.style.left = left.toFixed(5) + "%";
      bar.style.width = Math.max(0, percent(end, state) - left).toFixed(5) + "%";
      const from = run.start_ms == null ? "before the window" : clock(run.start_ms);
      const to = run.end_ms == null ? "now (held)" : clock(run.end_ms) + ", " + run.ending;
      const slot = run.slot == null ? "" : " slot " + run.slot;
      bar.title = "token " + run.token + slot + " · " + run.user + "@" + run.host + " · " + from + " – " + to;
      lanes[run.slot || 0].append(bar);
    }
    track.append(...lanes);
    for (const refusal of key.refusals) {
      const tick = el("div", "tick");
      tick.dataset.atMs = refusal.at_ms;
      tick.style.left = percent(refusal.at_ms, state).toFixed(5) + "%";
      const waited = refusal.waited_ms > 0 ? " after waiting " + span(refusal.waited_ms) : "";
      tick.title =
        "refused " + refusal.user + "@" + refusal.host + " (pid " + refusal.pid + ") at " + clock(refusal.at_ms) + waited;
      track.append(tick);
    }
    row.append(label, track);
    rows.push(row);
  }
  document.getElementById("timeline").replaceChildren(...rows);
  document.getElementById("timeline-empty").hidden = rows.length > 0;
}

function draw(state) {
  document.getElementById("source").textContent =
    state.backend + " · through agent " + state.agent_id;
  document.getElementById("updated").textContent =
    "updated " + clock(state.now_ms) + " · listing took " + state.listing_ms + " ms, " +
    state.pages + (state.pages === 1 ? " page" : " pages");
  const incomplete = document.getElementById("incomplete");
  incomplete.hidden = state.complete;
  incomplete.textContent = state.complete ? "" : "Incomplete listing: " + state.error;
  drawHeld(state);
  drawTimeline(state);
}

function live() {
  lastUpdate = new Date();
  document.body.classList.remove("stale");
  document.body.dataset.live = "true";
  document.getElementById("stale").hidden = true;
}

function stale(why) {
  document.body.classList.add("stale");
  document.body.dataset.live = "false";
  const banner = document.getElementById("stale");
  const since = lastUpdate ? "last update " + clock(lastUpdate.getTime()) : "no update yet";
  banner.textContent = "Not live: " + since + " — " + why;
  banner.hidden = false;
}

async function poll() {
  let next = POLL_MS;
  try {
    const response = await fetch(STATE_URL, {
      cache: "no-store",
      signal: AbortSignal.timeout(ANSWER_LIMIT_MS),
    });
    if (response.status === 403) {
      stale("the page's server refused it (restarted? open the address runlock ui printed)");
    } else {
      const body = await response.json();
      if (response.ok) {
        draw(body);
        live();
        next = Math.min(POLL_MAX_MS, Math.max(POLL_MS, 2 * body.listing_ms));
      } else {
        stale(body.error || "HTTP " + response.status);
      }
    }
  } catch (err) {
    stale(err && err.name === "TimeoutError"
      ? "no answer within " + ANSWER_LIMIT_MS / 1000 + " s"
      : "runlock ui does not answer (stopped?)");
  }
  setTimeout(poll, next);
}

drawLegend();
poll();
