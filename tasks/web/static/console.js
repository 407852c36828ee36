// The console's live parts: a turn page's timeline from its event stream (Server-Sent Events,
// tokens included), its status and actions asked for again (htmx) as events change them, and
// the approve forms' arguments checked as JSON before they are sent.
"use strict";

// Show 4xx/5xx answers too: they carry the notice that says what was refused.
htmx.config.responseHandling = [
  { code: "204", swap: false },
  { code: "[2345]..", swap: true },
];

const TERMINAL = new Set(["turn.succeeded", "turn.dead_lettered", "turn.cancelled"]);
// Events after which the pending actions differ (the rest refresh the status only): the
// actions are not asked for again otherwise, so arguments being edited stay as typed.
const ACTIONS_CHANGE = new Set(["turn.paused", "action.decided", "turn.resumed", ...TERMINAL]);

// Event ids are "<ms>-<seq>": whether `id` comes after `other`.
function after(id, other) {
  const [a, b] = id.split("-").map(Number);
  const [c, d] = other.split("-").map(Number);
  return a > c || (a === c && b > d);
}

function refresh(selector) {
  const part = document.querySelector(selector);
  if (part) htmx.trigger(part, "refresh");
}

function summary(event) {
  const data = event.data || {};
  const bits = [];
  for (const key of ["tool", "ok", "requestId", "decision", "actor", "reason", "error",
                     "waitingFor", "budget", "dueAt", "delayS"]) {
    if (data[key] !== undefined && data[key] !== null) bits.push(`${key}=${JSON.stringify(data[key])}`);
  }
  return bits.join(" ");
}

function followTurn(root) {
  const timeline = root.querySelector("[data-timeline]");
  const streamed = root.querySelector("[data-streamed]");
  const live = root.querySelector("[data-live]");
  const shown = root.dataset.shown || "0-0";
  const source = new EventSource(root.dataset.events);
  let discarded = new Set();
  source.onopen = () => { live.textContent = "live"; };
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) live.textContent = "stream closed";
    else live.textContent = "reconnecting…";
  };
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.type === "token.delta") {
      if (discarded.has(event.attempt)) return;
      streamed.hidden = false;
      streamed.textContent += event.data.text || "";
      return;
    }
    if (event.type === "attempt.discarded") {
      discarded.add(event.data.attempt);
      streamed.textContent = "";
    }
    const item = document.createElement("li");
    item.dataset.type = event.type;
    const at = document.createElement("time");
    at.dateTime = event.at;
    at.textContent = new Date(event.at).toLocaleTimeString();
    const type = document.createElement("span");
    type.className = "type";
    type.textContent = event.type;
    const detail = document.createElement("span");
    detail.className = "detail";
    detail.textContent = `attempt ${event.attempt} · iteration ${event.iteration} ${summary(event)}`;
    item.append(at, " ", type, " ", detail);
    timeline.append(item);
    if (after(event.id, shown)) {  // the parts already show what earlier events did
      refresh("#turn-status");
      if (ACTIONS_CHANGE.has(event.type)) refresh("#turn-actions");
    }
    if (TERMINAL.has(event.type)) {
      source.close();
      live.textContent = "ended";
    }
  };
  // sse-starlette names each event by its type: listen to every name through one handler.
  const types = ["turn.queued", "turn.started", "tool.started", "tool.finished",
    "iteration.persisted", "retry.scheduled", "token.delta", "attempt.discarded",
    "turn.handed_over", "turn.paused", "action.decided", "turn.resumed", "turn.succeeded",
    "turn.dead_lettered", "turn.cancelled", "budget.waiting"];
  for (const name of types) source.addEventListener(name, source.onmessage);
}

// An approve form's arguments must parse as a JSON object before anything is sent.
document.addEventListener("htmx:confirm", (evt) => {
  const form = evt.target.closest("form[data-json-check]");
  if (!form) return;
  const box = form.querySelector("[data-json]");
  const problem = form.querySelector(".json-problem");
  let message = "";
  if (box.value.trim()) {
    try {
      const value = JSON.parse(box.value);
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        message = "The arguments must be a JSON object.";
      }
    } catch (error) {
      message = `The arguments are not valid JSON: ${error.message}`;
    }
  }
  problem.hidden = !message;
  problem.textContent = message;
  if (message) evt.preventDefault();
});

document.addEventListener("DOMContentLoaded", () => {
  const turn = document.querySelector("[data-turn]");
  if (turn) followTurn(turn);
});
