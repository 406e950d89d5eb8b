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

// The Meltano add-on's locks around each state write (group "state_writes")
// are shown apart, each labelled by its state ID.
const STATE_WRITE_GROUP = "Meltano state writes (meltano-state-write:STATE_ID, the add-on's own locks)";

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
  const rows = { pipelines: [], state_writes: [] };
  for (const key of state.keys) {
    if (key.state !== "held") continue;
    const slots = key.slots ? key.holders.length + "/" + key.slots : "";
    key.holders.forEach((h, i) => {
      const row = el("tr", i === 0 ? "key" : "slot");
      row.dataset.key = key.key;
      const label = i === 0 ? key.label : "slot " + h.slot;
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
      if (i === 0) row.firstChild.title = key.key;
      if (i === 0 && key.waiters.length > 0) {
        row.lastChild.title = key.waiters
          .map((w) => w.user + "@" + w.host + " (pid " + w.pid + ") for " + span(state.now_ms - w.since_ms))
          .join("\n");
      }
      (rows[key.group] || rows.pipelines).push(row);
    });
  }
  document.getElementById("held-pipelines").replaceChildren(...rows.pipelines);
  const writes = rows.state_writes;
  if (writes.length > 0) {
    const heading = el("tr", "group");
    heading.append(el("th", null, STATE_WRITE_GROUP));
    heading.firstChild.colSpan = 9;
    writes.unshift(heading);
  }
  document.getElementById("held-state-writes").replaceChildren(...writes);
  document.getElementById("held-empty").hidden = rows.pipelines.length + writes.length > 0;
  const unreadable = state.keys
    .filter((k) => k.state === "unreadable")
    .map((k) => el("li", null, "unreadable record " + k.key + ": " + (k.unreadable || "")));
  document.getElementById("unreadable").replaceChildren(...unreadable);
}

const HOUR_MS = 3600 * 1000;
// The timeline's windows, smallest first; the state covers the largest.
const WINDOWS = [
  { name: "1h", ms: HOUR_MS, title: "Last hour" },
  { name: "6h", ms: 6 * HOUR_MS, title: "Last 6 hours" },
  { name: "24h", ms: 24 * HOUR_MS, title: "Last 24 hours" },
];
// Steps between the axis's times, in minutes: the smallest whose labels
// stand apart on the track's width is drawn.
const STEPS_MIN = [5, 10, 15, 30, 60, 120, 180, 360, 720];
// Space between two axis labels, in px.
const LABEL_GAP_PX = 12;

// The window the user picked, null for the one that fits the runs; kept in
// the address's fragment (beside the token in its query), so a reload keeps it.
let chosenWindow = windowInAddress();
let lastState = null; // the last listing, drawn again when the window or width changes

function windowInAddress() {
  const name = new URLSearchParams(location.hash.slice(1)).get("window");
  return WINDOWS.some((w) => w.name === name) ? name : null;
}

// The smallest window that holds every run and refusal of the state (a
// run begun before the state's start needs the largest).
function fittingWindow(state) {
  let earliest = state.now_ms;
  for (const key of state.keys) {
    for (const run of key.runs) {
      earliest = Math.min(earliest, run.start_ms == null ? state.since_ms : run.start_ms);
    }
    for (const refusal of key.refusals) earliest = Math.min(earliest, refusal.at_ms);
  }
  return WINDOWS.find((w) => state.now_ms - earliest <= w.ms) || WINDOWS[WINDOWS.length - 1];
}

function shownWindow(state) {
  return WINDOWS.find((w) => w.name === chosenWindow) || fittingWindow(state);
}

// Percent of the view from its start; kept fine-grained so that a bar
// visibly grows, and an observer can tell, between two polls.
function percent(ms, view) {
  const at = Math.min(Math.max(ms, view.since_ms), view.now_ms);
  return ((at - view.since_ms) * 100) / (view.now_ms - view.since_ms);
}

function axisMark(text, ms, view, className) {
  const mark = el("span", "axis-mark" + (className ? " " + className : ""), text);
  mark.style.left = percent(ms, view).toFixed(5) + "%";
  return mark;
}

// Whether two boxes come closer than the gap labels keep.
function crowded(a, b) {
  return a.left < b.right + LABEL_GAP_PX && b.left < a.right + LABEL_GAP_PX;
}

// The window's ends, then local times at the smallest step whose labels fit;
// every label is measured where it is laid out, and one that would crowd
// another already placed is left out.
function drawAxis(view, win) {
  const axis = document.getElementById("axis");
  const start = axisMark("−" + win.name, view.since_ms, view, "start");
  const now = axisMark("now " + clock(view.now_ms), view.now_ms, view, "now");
  axis.replaceChildren(start, now);
  // The width it was drawn for, so a reader can tell a redraw after a resize.
  axis.dataset.width = String(axis.clientWidth);
  const sample = axisMark("00:00", view.since_ms, view, "");
  axis.append(sample);
  const labelPx = sample.getBoundingClientRect().width;
  sample.remove();
  const pxPerMinute = axis.clientWidth / (win.ms / 60000);
  const stepMin = STEPS_MIN.find((m) => m * pxPerMinute >= labelPx + LABEL_GAP_PX);
  const timeline = document.querySelector(".timeline");
  if (stepMin === undefined) {
    timeline.style.removeProperty("--grid-step");
    timeline.style.removeProperty("--grid-first");
    return;
  }
  const step = stepMin * 60000;
  // Steps counted from local midnight, so marks read 09:00, not 09:30 in a
  // half-hour time zone.
  const offset = -new Date(view.since_ms).getTimezoneOffset() * 60000;
  const first = Math.ceil((view.since_ms + offset) / step) * step - offset;
  // A faint line down every track at each step, for reading a bar's time.
  timeline.style.setProperty("--grid-step", (stepMin * pxPerMinute).toFixed(3) + "px");
  timeline.style.setProperty("--grid-first", (((first - view.since_ms) / 60000) * pxPerMinute).toFixed(3) + "px");
  const placed = [start.getBoundingClientRect(), now.getBoundingClientRect()];
  for (let t = first; t < view.now_ms; t += step) {
    const mark = axisMark(clock(t).slice(0, 5), t, view, "");
    axis.insertBefore(mark, now);
    const box = mark.getBoundingClientRect();
    if (placed.some((other) => crowded(box, other))) {
      mark.remove();
    } else {
      placed.push(box);
    }
  }
}

function timelineRow(key, view) {
  const row = el("div", "tl-row");
  row.dataset.key = key.key;
  const label = el("div", "tl-label", key.label);
  label.title = key.key;
  const track = el("div", "tl-track");
  const laneCount = Math.max(key.slots || 1, ...key.runs.map((r) => (r.slot || 0) + 1));
  if (laneCount > 1) track.classList.add("lanes-many");
  const lanes = [];
  for (let i = 0; i < laneCount; i++) lanes.push(el("div", "lane"));
  let shown = 0;
  for (const run of key.runs) {
    const end = run.end_ms == null ? view.now_ms : run.end_ms;
    if (end < view.since_ms) continue;
    shown++;
    const startMs = run.start_ms == null ? view.since_ms : run.start_ms;
    const left = percent(startMs, view);
    const bar = el("div", "bar ending-" + run.ending);
    if (run.end_ms == null) bar.classList.add("open");
    if (run.start_ms == null || run.start_ms < view.since_ms) bar.classList.add("before");
    bar.dataset.ending = run.ending;
    bar.dataset.token = run.token;
    if (run.slot != null) bar.dataset.slot = run.slot;
    bar.style.left = left.toFixed(5) + "%";
    bar.style.width = Math.max(0, percent(end, view) - left).toFixed(5) + "%";
    const from = run.start_ms == null ? "before the last 24 hours" : clock(run.start_ms);
    const to = run.end_ms == null ? "now (held)" : clock(run.end_ms) + ", " + run.ending;
    const slot = run.slot == null ? "" : " slot " + run.slot;
    bar.title = "token " + run.token + slot + " · " + run.user + "@" + run.host + " · " + from + " – " + to;
    lanes[run.slot || 0].append(bar);
  }
  track.append(...lanes);
  for (const refusal of key.refusals) {
    if (refusal.at_ms < view.since_ms) continue;
    shown++;
    const tick = el("div", "tick");
    tick.dataset.atMs = refusal.at_ms;
    tick.style.left = percent(refusal.at_ms, view).toFixed(5) + "%";
    const waited = refusal.waited_ms > 0 ? " after waiting " + span(refusal.waited_ms) : "";
    tick.title =
      "refused " + refusal.user + "@" + refusal.host + " (pid " + refusal.pid + ") at " + clock(refusal.at_ms) + waited;
    track.append(tick);
  }
  if (shown === 0) return null;
  row.append(label, track);
  return row;
}

function drawTimeline(state) {
  const win = shownWindow(state);
  const view = { since_ms: state.now_ms - win.ms, now_ms: state.now_ms };
  document.body.dataset.window = win.name;
  document.getElementById("timeline-title").textContent = win.title;
  for (const button of document.querySelectorAll("#windows button")) {
    const name = button.dataset.window;
    button.setAttribute("aria-pressed", String(name === (chosenWindow || "fit")));
    button.classList.toggle("fitted", chosenWindow === null && name === win.name);
  }
  drawAxis(view, win);
  const rows = { pipelines: [], state_writes: [] };
  for (const key of state.keys) {
    const row = timelineRow(key, view);
    if (row) (rows[key.group] || rows.pipelines).push(row);
  }
  document.getElementById("timeline").replaceChildren(...rows.pipelines);
  document.getElementById("timeline-state-writes").replaceChildren(...rows.state_writes);
  document.getElementById("state-writes").hidden = rows.state_writes.length === 0;
  const empty = document.getElementById("timeline-empty");
  empty.hidden = rows.pipelines.length + rows.state_writes.length > 0;
  empty.textContent = "No key was held in the " + win.title.toLowerCase() + ".";
}

function drawWindows() {
  for (const button of document.querySelectorAll("#windows button")) {
    button.addEventListener("click", () => {
      chosenWindow = button.dataset.window === "fit" ? null : button.dataset.window;
      const fragment = chosenWindow ? "#window=" + chosenWindow : "";
      history.replaceState(null, "", location.pathname + location.search + fragment);
      if (lastState) drawTimeline(lastState);
    });
  }
  addEventListener("resize", () => {
    if (lastState) drawTimeline(lastState);
  });
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
  lastState = state;
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
drawWindows();
poll();
