// The token viewer: the session list (polled, so new sessions and turns appear without a
// reload) and one session's nodes, every token a box. Data comes from `GET /sessions` and
// `GET /{uuid}/view`; nothing is fetched from anywhere else.
"use strict";

const POLL_MS = 1500;
const $ = (id) => document.getElementById(id);
const state = { sessions: [], open: null, view: null, node: 0, textView: false, seen: "" };

// A sampled token's heat class: h0 (probability above 0.9) to h9 (0.1 or less).
function heat(logprob) {
  const p = Math.exp(logprob);
  return "h" + Math.max(0, Math.min(9, Math.floor((1 - p) * 10)));
}

function escapeHtml(text) {
  return text.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

async function fetched(path) {
  const key = sessionStorage.getItem("rollout-proxy-key");
  const headers = key ? { Authorization: "Bearer " + key } : {};
  const response = await fetch(path, { headers });
  if (response.status === 401) {
    $("key-form").hidden = false;
    throw new Error("this proxy needs a key");
  }
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response;
}

async function api(path) {
  return (await fetched(path)).json();
}

// Each image's bytes, fetched once (with the key, which an <img> could not send) and shown
// from a blob: URL.
const thumbnails = new Map();
async function showThumbnails(uuid) {
  for (const img of document.querySelectorAll("#tokens img.thumb[data-image]")) {
    const sha = img.dataset.image;
    if (!thumbnails.has(sha)) {
      thumbnails.set(sha, fetched("/" + uuid + "/blobs/" + sha).then((r) => r.blob()).then((b) => URL.createObjectURL(b)));
    }
    try {
      img.src = await thumbnails.get(sha);
    } catch (error) {
      img.alt = "image not available: " + error.message;
    }
  }
}

function ago(seconds) {
  const d = Math.max(0, Date.now() / 1000 - seconds);
  if (d < 60) return Math.round(d) + " s ago";
  if (d < 3600) return Math.round(d / 60) + " min ago";
  return Math.round(d / 3600) + " h ago";
}

// The list, newest first; reloads the open session when it changed.
async function refreshList() {
  let listed;
  try {
    listed = (await api("/sessions")).sessions;
  } catch (error) {
    $("status").textContent = error.message;
    return;
  }
  listed.sort((a, b) => b.last_accessed - a.last_accessed);
  state.sessions = listed;
  $("session-count").textContent = "(" + listed.length + ")";
  $("session-list").innerHTML = listed
    .map((s) => {
      const reward = s.reward == null ? "" : " · reward " + s.reward;
      const open = s.uuid === state.open ? ' class="open"' : "";
      return `<li${open} data-uuid="${s.uuid}"><a href="#${s.uuid}"><code>${s.uuid.slice(0, 8)}</code>` +
        `<span class="facts">${s.num_nodes} node${s.num_nodes === 1 ? "" : "s"}${reward} · ${ago(s.last_accessed)}</span></a></li>`;
    })
    .join("");
  $("status").textContent = "live · updated " + new Date().toLocaleTimeString();
  const open = listed.find((s) => s.uuid === state.open);
  const seen = open ? open.last_accessed + "/" + open.num_nodes + "/" + open.reward : "";
  if (open && seen !== state.seen) await loadSession(state.open, seen);
}

async function loadSession(uuid, seen) {
  try {
    const view = await api("/" + uuid + "/view");
    if (uuid !== state.open) return;
    state.view = view;
    state.seen = seen;
    state.node = Math.min(state.node, Math.max(0, view.nodes.length - 1));
    render();
  } catch (error) {
    $("session").innerHTML = `<p class="empty">${escapeHtml(error.message)}</p>`;
  }
}

function openFromHash() {
  const uuid = location.hash.slice(1);
  if (!uuid || uuid === state.open) return;
  state.open = uuid;
  state.node = 0;
  state.seen = "";
  document.querySelectorAll("#session-list li").forEach((li) => li.classList.toggle("open", li.dataset.uuid === uuid));
  const listed = state.sessions.find((s) => s.uuid === uuid);
  loadSession(uuid, listed ? listed.last_accessed + "/" + listed.num_nodes + "/" + listed.reward : "");
}

function legend() {
  const boxes = Array.from({ length: 10 }, (_, i) => `<i class="t h${i}" title="p ${(1 - i / 10).toFixed(1)}–${(0.9 - i / 10).toFixed(1)}"></i>`);
  return `<div class="legend">sampled, p=1 ${boxes.join("")} p=0 <span class="sep"></span>` +
    `<i class="t p"></i> prompt <span class="sep"></span><i class="t sp"></i> template markup` +
    `<span class="sep"></span><span class="call"><span class="call-tag">tool call</span></span></div>`;
}

// Positions flagged as where a rollout split: in the node that split off and in the node it
// was closest to.
function divergencePoints(view, index) {
  const points = new Map();
  for (const report of view.divergences) {
    const note = `node ${report.node} split here (${report.divergence.reason})`;
    if (report.node === index) points.set(report.position, note);
    if (report.closest_node === index) points.set(report.position, note);
  }
  return points;
}

function render() {
  const view = state.view;
  const node = view.nodes[state.node];
  const tabs = view.nodes
    .map((n, i) => `<button data-node="${i}"${i === state.node ? ' class="open"' : ""}>node ${i}</button>`)
    .join(" ");
  const reward = view.reward ? ` · reward <b>${view.reward.reward}</b>` : "";
  let html = `<div class="toolbar"><h2>Session <code>${view.session}</code>${reward}</h2>` +
    `<div class="node-tabs">${tabs}</div>` +
    `<label><input type="checkbox" id="text-view"${state.textView ? " checked" : ""}> rendered text</label>` +
    legend() + `</div>`;
  if (!node) {
    $("session").innerHTML = html + '<p class="empty">No turn yet.</p>';
    return;
  }
  const sampled = node.logprobs.filter((lp) => lp !== null);
  const mean = sampled.length ? sampled.reduce((a, b) => a + b, 0) / sampled.length : 0;
  html += `<div class="stats">${node.tokens.length} tokens · ${sampled.length} sampled · ` +
    `${node.turns.length} turns · mean sampled logprob ${mean.toFixed(3)} · tool format ${view.tool_parser}</div>`;
  if (node.divergence) {
    const d = node.divergence;
    const report = view.divergences.find((r) => r.node === state.node);
    const where = report && report.closest_node != null
      ? ` Closest: node ${report.closest_node}, first different token at position ${report.position} (flagged in both).`
      : "";
    html += `<div class="banner">Started instead of extending ${d.from_node == null ? "an earlier node" : "node " + d.from_node}` +
      `${d.token_position == null ? "" : " at token " + d.token_position}: <b>${escapeHtml(d.reason)}</b> — ` +
      `${escapeHtml(d.detail)}.${where}</div>`;
  }
  html += `<div id="tokens" class="tokens${state.textView ? " text-view" : ""}">` +
    (state.textView ? textBody(node) : tokenBody(node, divergencePoints(view, state.node))) + "</div>";
  $("session").innerHTML = html;
  showThumbnails(view.session);
}

function turnHeader(node, turn) {
  const t = node.turns[turn];
  if (!t) return "";
  const weights = t.weight_version ? " · weights " + escapeHtml(t.weight_version) : "";
  return `<div class="turn-sep">turn ${turn} · ${t.api} · ${escapeHtml(t.backend)}${weights} · ` +
    `${t.completion_tokens} sampled · finish ${t.finish_reason}</div>`;
}

function messageOpen(node, message, index) {
  return `<div class="msg role-${message.role}" data-message="${index}">` +
    `<div class="msg-head">${message.role === "tool" ? "tool result" : message.role}</div><div class="msg-body">`;
}

// Every message's text as the template rendered it.
function textBody(node) {
  let lastTurn = -1;
  return node.messages
    .map((m, index) => {
      const head = m.turn !== lastTurn ? turnHeader(node, m.turn) : "";
      lastTurn = m.turn;
      return head + messageOpen(node, m, index) + escapeHtml(node.pieces.slice(m.start, m.end).join("")) + "</div></div>";
    })
    .join("");
}

// One box per token, built as one string: a 64k-token node is one innerHTML assignment.
function tokenBody(node, points) {
  const special = new Set(node.special);
  const callAt = new Map(node.calls.map((c) => [c.start, c]));
  const imageAt = new Map(node.images.map((image) => [image.offset, image]));
  const out = [];
  let lastTurn = -1;
  let callEnd = -1;
  node.messages.forEach((m, index) => {
    if (m.turn !== lastTurn) out.push(turnHeader(node, m.turn));
    lastTurn = m.turn;
    out.push(messageOpen(node, m, index));
    for (let i = m.start; i < m.end; i++) {
      const image = imageAt.get(i);
      if (image) {
        // The image where its run of placeholders stands, one box for the whole run.
        const [, h, w] = image.grid_thw;
        out.push(`<span class="t p image" data-i="${i}" title="${image.length} placeholders, grid ${h}x${w}">` +
          `<img class="thumb" data-image="${escapeHtml(image.sha256)}" alt="image ${escapeHtml(image.sha256.slice(0, 12))}"></span>`);
        i += image.length - 1;
        continue;
      }
      const call = callAt.get(i);
      if (call) {
        out.push(`<span class="call${call.healed ? " healed" : ""}" data-call="${escapeHtml(call.name)}">` +
          `<span class="call-tag">${call.healed ? "healed call" : "call"} ${escapeHtml(call.name)}` +
          `${call.healed_from ? " (" + escapeHtml(call.healed_from) + ")" : ""}</span>`);
        callEnd = call.end;
      }
      const lp = node.logprobs[i];
      let cls = lp === null ? (special.has(i) ? "t sp" : "t p") : "t " + heat(lp);
      if (points.has(i)) cls += " div";
      const piece = node.pieces[i].replace(/\n/g, "↵\n");
      out.push(`<span class="${cls}" data-i="${i}">${escapeHtml(piece)}</span>`);
      if (i + 1 === callEnd) {
        out.push("</span>");
        callEnd = -1;
      }
    }
    if (callEnd !== -1) {
      out.push("</span>");
      callEnd = -1;
    }
    out.push("</div></div>");
  });
  return out.join("");
}

function showTip(event) {
  const box = event.target.closest(".t[data-i]");
  const tip = $("tip");
  if (!box || !state.view) {
    tip.hidden = true;
    return;
  }
  const node = state.view.nodes[state.node];
  const i = Number(box.dataset.i);
  const message = node.messages.find((m) => m.start <= i && i < m.end);
  const turn = message ? node.turns[message.turn] : null;
  const lp = node.logprobs[i];
  const lines = [
    `position ${i} · id ${node.tokens[i]}`,
    `text ${JSON.stringify(node.pieces[i])}`,
    lp === null ? "prompt (not sampled)" : `logprob ${lp.toFixed(4)} · p ${Math.exp(lp).toFixed(3)}`,
  ];
  const image = node.images.find((im) => im.offset === i);
  if (image) lines.push(`image ${image.sha256.slice(0, 16)}… · ${image.media_type} · ${image.length} placeholders · grid ${image.grid_thw.join("x")}`);
  if (message) lines.push(`message ${message.role} · turn ${message.turn}`);
  if (turn) lines.push(`backend ${turn.backend}${turn.weight_version ? " · weights " + turn.weight_version : ""}`);
  const point = divergencePoints(state.view, state.node).get(i);
  if (point) lines.push(point);
  tip.textContent = lines.join("\n");
  tip.hidden = false;
  tip.style.left = Math.min(event.clientX + 12, window.innerWidth - 430) + "px";
  tip.style.top = event.clientY + 16 + "px";
}

document.addEventListener("click", (event) => {
  const tab = event.target.closest("[data-node]");
  if (tab) {
    state.node = Number(tab.dataset.node);
    render();
  }
});
document.addEventListener("change", (event) => {
  if (event.target.id === "text-view") {
    state.textView = event.target.checked;
    render();
  }
});
document.addEventListener("mouseover", showTip);
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("rollout-proxy-key", $("key").value);
  $("key-form").hidden = true;
  refreshList();
});
window.addEventListener("hashchange", openFromHash);

openFromHash();
refreshList();
setInterval(refreshList, POLL_MS);
