// The device's page: a chat over the device's OpenAI-compatible API, its
// documents over /v1/documents, and its state from /v1/status. Plain
// script, no build step; everything it loads comes from the device.
"use strict";

const $ = (id) => document.getElementById(id);
const store = {
  get(key, fallback) {
    try { const v = localStorage.getItem("dragon." + key); return v === null ? fallback : JSON.parse(v); }
    catch { return fallback; }
  },
  set(key, v) { localStorage.setItem("dragon." + key, JSON.stringify(v)); },
};

// The token is typed once and kept in this browser; it goes in a header,
// never a cookie, so no other site's page can use it.
let token = store.get("token", "");
let status = null;
let model = "";
let settings = store.get("settings", null);
let history = store.get("history", []); // [{role, content, sources?, meta?}]
let running = null; // the AbortController of the answer being streamed

// What the browser test reads: for each text chunk, the time from its
// arrival to the frame that shows it (performance.now()); the answers
// finished; the times an answer waited in the device's queue.
window.dragonMetrics = { paint: [], answers: 0, queued: 0 };

class APIError extends Error {
  constructor(status, message, retryAfter) { super(message); this.status = status; this.retryAfter = retryAfter; }
}

async function api(path, init = {}) {
  const headers = new Headers(init.headers || {});
  if (token) headers.set("Authorization", "Bearer " + token);
  const resp = await fetch(path, { ...init, headers });
  if (resp.status === 401) {
    askToken("That token was refused. Type the device's token.");
    throw new APIError(401, "the device wants its token");
  }
  if (!resp.ok) {
    let msg = resp.statusText;
    try { const body = await resp.json(); msg = (body.error && body.error.message) || msg; } catch { /* not JSON */ }
    throw new APIError(resp.status, msg, Number(resp.headers.get("Retry-After")) || 0);
  }
  return resp;
}

// ---- status line ----

async function refreshStatus() {
  try {
    status = await (await api("/v1/status")).json();
  } catch (e) {
    if (e.status !== 401) showStatus([["off", "device unreachable"], e.message]);
    return;
  }
  if (!settings) settings = defaults();
  fillModes();
  renderStatus();
}

function defaults() {
  const d = status.defaults;
  return { mode: d.mode, passages_device: d.passages_device, passages_cloud: d.passages_cloud,
    temperature: 0, max_tokens: d.max_tokens, source_prefix: "", from: "", after: "", before: "", cloud_source_prefix: "" };
}

let lastAnswer = null;

function renderStatus() {
  const parts = [];
  const c = status.cloud;
  if (!c.configured) parts.push(["off", "device only: no cloud configured"]);
  else if (c.state === "ready" || c.state === "idle") parts.push(["on", "cloud connected"]);
  else if (c.state === "connecting") parts.push(["off", "connecting to the cloud"]);
  else parts.push(["off", "cloud unreachable: answers come from this device alone"]);
  parts.push("device model " + status.device_model);
  if (c.model) parts.push("cloud model " + c.model);
  if (status.queued > 0) parts.push(status.queued + " waiting");
  if (lastAnswer) {
    parts.push(lastAnswer.tokens_per_second.toFixed(1) + " tokens/s");
    parts.push("decided by " + decidedBy(lastAnswer));
  }
  showStatus(parts);
}

function decidedBy(s) {
  const d = s.steps_aggregated_device, c = s.steps_aggregated_cloud;
  if (s.fallback) return "the device alone (the cloud failed)";
  if (!c) return "the device";
  if (!d) return "the cloud";
  return `the device ${d} steps, the cloud ${c}`;
}

function showStatus(parts) {
  const el = $("status");
  el.replaceChildren();
  parts.forEach((p, i) => {
    if (i) el.append(" · ");
    if (Array.isArray(p)) { const s = document.createElement("span"); s.className = p[0]; s.textContent = p[1]; el.append(s); }
    else el.append(p);
  });
}

// ---- the conversation ----

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function renderHistory() {
  $("messages").replaceChildren();
  for (const m of history) {
    const li = addMessage(m.role, m.content);
    if (m.sources) renderSources(li, m.sources);
    if (m.meta) li.append(el("p", "meta", m.meta));
    if (m.fallback) li.append(el("p", "fallback", m.fallback));
  }
  $("empty").hidden = history.length > 0;
}

function addMessage(role, text) {
  const li = el("li", "msg " + role);
  li.append(el("h3", "visually-hidden", role === "user" ? "You asked" : "The answer"));
  li.append(el("div", "text", text));
  $("messages").append(li);
  $("empty").hidden = true;
  li.scrollIntoView({ block: "end" });
  return li;
}

function pct(x) { return x > 0 && x < 0.005 ? "<1%" : (100 * x).toFixed(0) + "%"; }

function renderSources(li, sources) {
  const groups = [
    ["device", "On this device: private, stays on this device", sources.filter((s) => s.side === "device")],
    ["cloud", "From the cloud: public", sources.filter((s) => s.side === "cloud")],
  ];
  const box = el("div", "sources");
  for (const [side, title, list] of groups) {
    if (!list.length) continue;
    const sec = el("section", side);
    sec.append(el("h3", "", title));
    const ol = el("ol");
    for (const s of list.slice().sort((a, b) => b.share - a.share)) {
      const item = el("li");
      const det = el("details");
      const sum = el("summary");
      sum.append(s.title || s.source, " ");
      // The share is the answer's posterior over passages: how much of
      // its probability this passage's sequence carries.
      sum.append(el("span", "share", "· share " + pct(s.share)));
      det.append(sum);
      if (s.title && s.title !== s.source) det.append(el("p", "meta", s.source));
      if (s.metadata && s.metadata.page) det.append(el("p", "meta", "page " + s.metadata.page));
      det.append(el("blockquote", "", s.excerpt || "(no excerpt)"));
      item.append(det);
      ol.append(item);
    }
    sec.append(ol);
    box.append(sec);
  }
  if (box.childElementCount) li.append(box);
}

function progressText(p) {
  switch (p.phase) {
    case "queued": return `Waiting: ${p.queue_position} answer${p.queue_position === 1 ? "" : "s"} ahead of this one…`;
    case "retrieving": return "Retrieving passages…";
    case "prefilling": {
      const dev = `${p.passages_device || 0} passage${p.passages_device === 1 ? "" : "s"} on this device`;
      return p.passages_cloud ? `Reading ${dev} and up to ${p.passages_cloud} on the cloud…` : `Reading ${dev}…`;
    }
  }
  return "Working…";
}

function requestBody(prompt) {
  const s = settings || {};
  const messages = history.slice(-8).map((m) => ({ role: m.role, content: m.content }));
  messages.push({ role: "user", content: prompt });
  const body = { model, messages, stream: true, progress: true, mode: s.mode,
    passages_device: Number(s.passages_device) || undefined, passages_cloud: Number(s.passages_cloud) || undefined,
    temperature: Number(s.temperature), max_tokens: Number(s.max_tokens) || undefined };
  const f = {};
  for (const k of ["source_prefix", "from", "after", "before"]) if (s[k]) f[k] = s[k];
  if (Object.keys(f).length) body.filter = f;
  if (s.cloud_source_prefix) body.cloud_filter = { source_prefix: s.cloud_source_prefix };
  return body;
}

async function ask(prompt) {
  addMessage("user", prompt);
  const li = addMessage("assistant", "");
  li.setAttribute("aria-busy", "true");
  const text = li.querySelector(".text");
  const progress = el("p", "progress", "Sending…");
  li.prepend(progress);
  running = new AbortController();
  setRunning(true);
  let answer = "", summary = null, sources = [], fallback = "";
  const noteFallback = () => {
    if (fallback) return;
    fallback = "The cloud stopped answering: this device finishes the answer alone, from its own documents.";
    li.append(el("p", "fallback", fallback));
    showNotice(fallback);
  };
  try {
    let resp;
    for (;;) {
      try {
        resp = await api("/v1/chat/completions", { method: "POST", body: JSON.stringify(requestBody(prompt)),
          headers: { "Content-Type": "application/json" }, signal: running.signal });
        break;
      } catch (e) {
        if (e.status !== 429) throw e;
        // Busy past the device's queue: wait as long as it says, then ask again.
        const wait = Math.max(1, e.retryAfter || 2);
        progress.textContent = `The device is busy; asking again in ${wait} s…`;
        await sleep(wait * 1000, running.signal);
      }
    }
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
        for (const line of block.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const ev = JSON.parse(data);
          if (ev.error) throw new APIError(500, ev.error.message);
          if (ev.dragon_progress) {
            if (ev.dragon_progress.phase === "queued") window.dragonMetrics.queued++;
            progress.textContent = progressText(ev.dragon_progress);
            continue;
          }
          if (ev.dragon_fallback) noteFallback();
          const ch = ev.choices && ev.choices[0];
          const piece = ch && ch.delta && ch.delta.content;
          if (piece) {
            const got = performance.now();
            if (!answer) progress.remove();
            answer += piece;
            const follow = nearBottom();
            text.textContent = answer;
            if (follow) li.scrollIntoView({ block: "end" });
            requestAnimationFrame(() => window.dragonMetrics.paint.push(performance.now() - got));
          }
          if (ev.dragon) { summary = ev.dragon; sources = ev.sources || []; }
        }
      }
    }
    progress.remove();
    if (summary && summary.fallback) noteFallback();
    if (summary) {
      lastAnswer = summary;
      renderStatus(); // now, not when the status refresh below comes back
      const follow = nearBottom();
      renderSources(li, sources);
      const meta = `${summary.tokens} tokens · first after ${(summary.ttft_ms / 1000).toFixed(1)} s · ${summary.tokens_per_second.toFixed(1)} tokens/s · decided by ${decidedBy(summary)}`;
      li.append(el("p", "meta", meta));
      if (follow) li.scrollIntoView({ block: "end" });
      history.push({ role: "user", content: prompt }, { role: "assistant", content: answer, sources, meta, fallback });
      store.set("history", history.slice(-40));
      window.dragonMetrics.answers++;
    }
  } catch (e) {
    progress.remove();
    li.append(el("p", "error", e.name === "AbortError" ? "Stopped." : "No answer: " + e.message));
  } finally {
    li.removeAttribute("aria-busy");
    running = null;
    setRunning(false);
    refreshStatus();
  }
}

// nearBottom says whether the reader is at the end of the conversation,
// where a growing answer should keep them.
function nearBottom() {
  return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 80;
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(t); reject(new DOMException("stopped", "AbortError")); }, { once: true });
  });
}

function setRunning(on) {
  $("send").disabled = on;
  $("stop").hidden = !on;
}

function showNotice(text) {
  const n = $("notice");
  n.textContent = text;
  n.hidden = false;
}

// ---- documents ----

// The list shows the documents added last; search reaches the rest.
const LIST_SIZE = 100;

async function listDocuments() {
  let body;
  try { body = await (await api("/v1/documents?order=recent&limit=" + LIST_SIZE)).json(); }
  catch (e) { $("doc-count").textContent = "Documents: " + e.message; return; }
  const shown = body.documents.length;
  $("doc-count").textContent = `${body.total} document${body.total === 1 ? "" : "s"}` +
    (shown < body.total ? `, the ${shown} added last shown (search finds any)` : "");
  const rows = body.documents.map((d) => {
    const tr = el("tr", d.status === "failed" ? "failed" : "");
    const name = el("td");
    name.append(d.title || d.source);
    if (d.title && d.title !== d.source) name.append(el("div", "meta", d.source));
    tr.append(name);
    let st = d.status;
    if (d.status === "embedding") st += ` ${d.embedded}/${d.passages}`;
    if (d.status === "failed") st += ": " + d.error;
    tr.append(el("td", d.status === "failed" ? "failed-reason" : "", st), el("td", "", String(d.passages)));
    const del = el("button", "", "Delete");
    del.type = "button";
    del.setAttribute("aria-label", "Delete " + d.source);
    del.addEventListener("click", async () => {
      del.disabled = true;
      try { await api("/v1/documents/" + encodeURIComponent(d.id), { method: "DELETE" }); }
      catch (e) { alertIn($("upload-result"), "Not deleted: " + e.message); }
      listDocuments();
    });
    const td = el("td"); td.append(del); tr.append(td);
    return tr;
  });
  $("doc-list").replaceChildren(...rows);
  const busy = body.documents.some((d) => d.status === "embedding" || d.status === "writing");
  if (busy && $("docs").open) setTimeout(listDocuments, 1500);
}

function alertIn(list, text) {
  const li = el("li", "failed", text);
  li.setAttribute("role", "alert");
  list.append(li);
}

function upload(files) {
  if (!files.length) return;
  const fd = new FormData();
  for (const f of files) fd.append("file", f, f.name);
  const xhr = new XMLHttpRequest();
  xhr.open("POST", "/v1/documents");
  if (token) xhr.setRequestHeader("Authorization", "Bearer " + token);
  $("upload").hidden = false;
  $("upload-label").textContent = `Uploading ${files.length} file${files.length === 1 ? "" : "s"}…`;
  const bar = $("upload-bar");
  bar.value = 0;
  xhr.upload.onprogress = (e) => { if (e.lengthComputable) bar.value = (100 * e.loaded) / e.total; };
  xhr.upload.onload = () => { $("upload-label").textContent = "Reading and indexing…"; };
  xhr.onload = () => {
    $("upload").hidden = true;
    const out = $("upload-result");
    out.replaceChildren();
    let body = {};
    try { body = JSON.parse(xhr.responseText); } catch { /* not JSON */ }
    if (xhr.status !== 200) { alertIn(out, "Upload refused: " + ((body.error && body.error.message) || xhr.statusText)); return; }
    for (const d of body.documents) {
      if (d.status === "failed") alertIn(out, `${d.source}: ${d.error}`);
      else out.append(el("li", "", `${d.source}: ${d.unchanged ? "unchanged" : "added"}, ${d.passages} passage${d.passages === 1 ? "" : "s"}`));
    }
    listDocuments();
  };
  xhr.onerror = () => { $("upload").hidden = true; alertIn($("upload-result"), "Upload failed: the device did not answer"); };
  xhr.send(fd);
}

async function searchDocuments(q) {
  const out = $("doc-hits");
  out.replaceChildren();
  try {
    const body = await (await api("/v1/documents/search?k=5&q=" + encodeURIComponent(q))).json();
    if (!body.hits.length) out.append(el("li", "", "Nothing found."));
    for (const h of body.hits) {
      const li = el("li", "", h.source);
      li.append(el("blockquote", "", h.text));
      out.append(li);
    }
  } catch (e) { alertIn(out, "Search failed: " + e.message); }
}

// ---- settings and token ----

function fillModes() {
  const sel = $("set-mode");
  if (sel.options.length) return;
  for (const m of status.modes) sel.append(new Option(m, m));
}

function openSettings() {
  const f = $("settings-form");
  for (const [k, v] of Object.entries(settings || {})) if (f.elements[k]) f.elements[k].value = v;
  $("settings").showModal();
}

function saveSettings() {
  const f = $("settings-form");
  settings = { ...settings };
  for (const k of Object.keys(defaults())) if (f.elements[k]) settings[k] = f.elements[k].value;
  store.set("settings", settings);
}

function askToken(why) {
  const err = $("token-error");
  err.hidden = !why;
  err.textContent = why || "";
  if (!$("token").open) $("token").showModal();
  $("token-input").focus();
}

async function start() {
  try {
    const models = await (await api("/v1/models")).json();
    model = models.data[0].id;
  } catch (e) {
    if (e.status !== 401) showStatus([["off", "device unreachable"], e.message]);
    return;
  }
  await refreshStatus();
  setInterval(refreshStatus, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  renderHistory();
  $("ask").addEventListener("submit", (e) => {
    e.preventDefault();
    const p = $("prompt").value.trim();
    if (!p || running || !model) return;
    $("prompt").value = "";
    ask(p);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("ask").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => running && running.abort());
  $("new-chat").addEventListener("click", () => { history = []; store.set("history", history); $("notice").hidden = true; renderHistory(); $("prompt").focus(); });
  $("open-docs").addEventListener("click", () => { $("docs").showModal(); listDocuments(); });
  $("open-settings").addEventListener("click", openSettings);
  $("open-token").addEventListener("click", () => askToken(""));
  $("settings-form").addEventListener("submit", saveSettings);
  for (const b of document.querySelectorAll("[data-close]")) b.addEventListener("click", () => b.closest("dialog").close());
  $("token-form").addEventListener("submit", () => {
    token = $("token-input").value.trim();
    store.set("token", token);
    start();
  });
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => { e.preventDefault(); drop.classList.remove("over"); upload([...e.dataTransfer.files]); });
  $("file").addEventListener("change", () => { upload([...$("file").files]); $("file").value = ""; });
  $("doc-search").addEventListener("submit", (e) => { e.preventDefault(); const q = $("doc-q").value.trim(); if (q) searchDocuments(q); });
  start();
});
