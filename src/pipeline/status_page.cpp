// GET /: the status page, one self-contained HTML document (no external script, style,
// font or image: the Content-Security-Policy sent with it forbids them). It carries no
// data: it polls GET /status.json every 2 s (with the bearer token the operator types
// when the server asks for one, kept in the tab's sessionStorage) and draws what that
// answers. Everything it shows is set through textContent, never parsed as HTML.
// Request rates and the windowed p99 are computed here from the differences between two
// polls; every other figure is the server's as it answered. docs/api.md, "Status page".
#include "pipeline/endpoints.hpp"

namespace metad::pipeline {

const std::string_view kStatusPage = R"metadpage(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>hf3fs-metad</title>
<style>
:root { --fg:#1d2430; --muted:#5d6776; --bg:#f6f7f9; --card:#fff; --line:#dde1e7;
  --free:#b9dfc4; --reserved:#f2c46d; --bound:#5b8def; --incomplete:#e0645c; --inflight:#f2c46d; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color:var(--fg); background:var(--bg); }
header { display:flex; align-items:baseline; gap:16px; padding:12px 20px; background:#1d2430; color:#fff; }
header h1 { font-size:18px; margin:0; }
header .sub { color:#b8c0cc; }
main { padding:16px 20px; display:grid; gap:16px; grid-template-columns:repeat(auto-fit, minmax(420px, 1fr)); }
section { background:var(--card); border:1px solid var(--line); border-radius:6px; padding:12px 14px; }
section.wide { grid-column:1 / -1; }
h2 { font-size:14px; margin:0 0 8px; text-transform:uppercase; letter-spacing:.04em; color:var(--muted); }
.kv { display:grid; grid-template-columns:max-content 1fr; gap:2px 14px; }
.kv dt { color:var(--muted); }
.kv dd { margin:0; font-variant-numeric:tabular-nums; }
.big { font-size:28px; font-weight:600; font-variant-numeric:tabular-nums; }
table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
th, td { text-align:right; padding:3px 8px; border-bottom:1px solid var(--line); white-space:nowrap; }
th:first-child, td:first-child { text-align:left; }
th { color:var(--muted); font-weight:500; }
.bar { display:flex; height:14px; width:100%; min-width:160px; border-radius:3px; overflow:hidden; background:#eceff3; }
.bar span { display:block; height:100%; }
.seg-free { background:var(--free); } .seg-reserved { background:var(--reserved); }
.seg-bound { background:var(--bound); } .seg-incomplete { background:var(--incomplete); }
.seg-in_flight { background:var(--inflight); }
.legend { display:flex; gap:12px; color:var(--muted); font-size:12px; margin:4px 0 8px; }
.legend i { display:inline-block; width:10px; height:10px; margin-right:4px; border-radius:2px; vertical-align:-1px; }
.warn { color:#8a5a00; } .error { color:#b3261e; }
.ok { color:#1e7b34; } .bad { color:#b3261e; }
#auth { display:none; padding:16px 20px; }
#auth form { display:flex; gap:8px; align-items:center; }
#auth input { font:inherit; padding:4px 8px; width:28em; }
#problem { display:none; margin:12px 20px 0; padding:8px 12px; border-radius:4px; background:#fdecea; color:#b3261e; }
#errors { display:none; }
.muted { color:var(--muted); }
ul.lines { list-style:none; margin:0; padding:0; font:12px/1.5 ui-monospace, monospace; max-height:260px; overflow:auto; }
ul.lines li { border-bottom:1px solid var(--line); padding:2px 0; white-space:pre-wrap; word-break:break-all; }
</style>
</head>
<body>
<header><h1>hf3fs-metad</h1><span class="sub" id="headline">loading…</span></header>
<div id="problem"></div>
<div id="auth">
  <p>This server needs its bearer token (<code>--auth-token-file</code>) to show its status.</p>
  <form id="auth-form"><input id="token" type="password" autocomplete="off" placeholder="token">
  <button type="submit">Show status</button></form>
</div>
<main id="main" hidden>
  <section>
    <h2>Node</h2>
    <dl class="kv">
      <dt>role</dt><dd id="role"></dd>
      <dt>serving</dt><dd id="serving"></dd>
      <dt>epoch</dt><dd id="epoch"></dd>
      <dt>leader</dt><dd id="leader"></dd>
      <dt>standby in sync</dt><dd id="standby"></dd>
      <dt>version</dt><dd id="version"></dd>
      <dt>uptime</dt><dd id="uptime"></dd>
      <dt>cores</dt><dd id="cores"></dd>
    </dl>
  </section>
  <section>
    <h2>Cache</h2>
    <div class="big" id="hit-ratio"></div>
    <div class="muted">hit ratio of the exists lookups (batch_exists, SGLang exists), keys since start</div>
    <table id="lookups"><thead><tr><th>lookup</th><th>hit</th><th>miss</th><th>ratio</th></tr></thead><tbody></tbody></table>
    <dl class="kv" style="margin-top:8px">
      <dt>pages from free / eviction</dt><dd id="allocations"></dd>
    </dl>
  </section>
  <section>
    <h2>Memory</h2>
    <div class="big" id="memory-pct"></div>
    <div class="bar" id="memory-bar"></div>
    <dl class="kv" style="margin-top:8px">
      <dt>used</dt><dd id="memory-used"></dd>
      <dt>--memory-max</dt><dd id="memory-max"></dd>
    </dl>
  </section>
  <section class="wide">
    <h2>Endpoints</h2>
    <table id="endpoints"><thead><tr><th>endpoint</th><th>requests</th><th>req/s</th><th>p99 (last poll)</th><th>p99 (since start)</th><th>5xx</th></tr></thead><tbody></tbody></table>
  </section>
  <section class="wide">
    <h2>vLLM ranks</h2>
    <div class="legend"><span><i class="seg-free"></i>free</span><span><i class="seg-reserved"></i>reserved</span><span><i class="seg-bound"></i>bound</span><span><i class="seg-incomplete"></i>bound to incomplete keys</span></div>
    <table id="ranks"><thead><tr><th>rank</th><th>pages</th><th>free</th><th>reserved</th><th>bound</th><th>incomplete</th><th style="width:40%">fill</th></tr></thead><tbody></tbody></table>
    <div class="muted" id="ranks-note"></div>
  </section>
  <section class="wide">
    <h2>SGLang pools</h2>
    <div class="legend"><span><i class="seg-free"></i>free</span><span><i class="seg-in_flight"></i>in flight</span><span><i class="seg-bound"></i>bound</span></div>
    <table id="pools"><thead><tr><th>pool</th><th>pages</th><th>free</th><th>in flight</th><th>bound</th><th style="width:40%">fill</th></tr></thead><tbody></tbody></table>
    <div class="muted" id="pools-note"></div>
  </section>
  <section class="wide">
    <h2>Last warnings</h2>
    <ul class="lines" id="warnings"></ul>
  </section>
</main>
<pre id="errors"></pre>
<script>
"use strict";
(function () {
  var POLL_MS = 2000;
  var errorsBox = document.getElementById("errors");
  function reportError(text) {
    errorsBox.style.display = "block";
    errorsBox.textContent += text + "\n";
    document.body.setAttribute("data-errors", "1");
  }
  window.addEventListener("error", function (e) { reportError("error: " + e.message); });
  window.addEventListener("unhandledrejection", function (e) { reportError("rejection: " + e.reason); });

  var token = null;
  try { token = window.sessionStorage.getItem("hf3fs-metad-token"); } catch (e) { token = null; }
  var previous = null;  // the last answer and when it came, for rates
  var timer = null;

  function $(id) { return document.getElementById(id); }
  function text(id, value) { $(id).textContent = value; }
  function el(tag, content, cls) {
    var e = document.createElement(tag);
    if (content !== undefined && content !== null) e.textContent = String(content);
    if (cls) e.className = cls;
    return e;
  }
  function row(cells) {
    var tr = document.createElement("tr");
    cells.forEach(function (c) {
      if (c instanceof Node) { var td = document.createElement("td"); td.appendChild(c); tr.appendChild(td); }
      else tr.appendChild(el("td", c));
    });
    return tr;
  }
  function fill(tbody, rows) {
    while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
    rows.forEach(function (r) { tbody.appendChild(r); });
  }
  function pct(part, whole) {
    if (!whole) return "–";
    return (100 * part / whole).toFixed(1) + "%";
  }
  function bytes(n) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0, v = n;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(v) : v.toFixed(1)) + " " + units[i];
  }
  function duration(s) {
    var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    var sec = Math.floor(s % 60);
    return (d ? d + "d " : "") + (d || h ? h + "h " : "") + (d || h || m ? m + "m " : "") + sec + "s";
  }
  function when(ms) { return new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC"); }
  function bar(parts, total) {
    var b = el("div", null, "bar");
    parts.forEach(function (p) {
      if (!total || p[1] <= 0) return;
      var s = el("span", null, "seg-" + p[0]);
      s.style.width = (100 * p[1] / total) + "%";
      s.title = p[0] + ": " + p[1];
      b.appendChild(s);
    });
    return b;
  }
  // The p99 of a histogram's bucket counts (upper bounds in µs, then +Inf), in ms, as
  // Prometheus' histogram_quantile interpolates; null without samples.
  function p99(buckets, bounds) {
    var count = buckets.reduce(function (a, b) { return a + b; }, 0);
    if (count <= 0) return null;
    var rank = 0.99 * count, cum = 0;
    for (var i = 0; i < buckets.length; i++) {
      var before = cum;
      cum += buckets[i];
      if (cum < rank) continue;
      if (i >= bounds.length) return bounds[bounds.length - 1] / 1000;
      var lower = i === 0 ? 0 : bounds[i - 1], upper = bounds[i];
      var within = buckets[i] === 0 ? 1 : (rank - before) / buckets[i];
      return (lower + (upper - lower) * within) / 1000;
    }
    return bounds[bounds.length - 1] / 1000;
  }
  function ms(v) { return v === null || v === undefined ? "–" : v.toFixed(3) + " ms"; }

  function render(s, at) {
    var n = s.node;
    text("headline", n.role + (n.serving ? ", serving" : ", not serving") + " · v" + s.version);
    text("role", n.role);
    var serving = $("serving");
    serving.textContent = n.serving ? "yes" : "no";
    serving.className = n.serving ? "ok" : "bad";
    text("epoch", n.ha ? String(n.epoch) : "– (no --ha-etcd)");
    text("leader", n.ha ? (n.leader ? n.leader.id + (n.leader.url ? " at " + n.leader.url : "") : "none known") : "–");
    var r = n.replication;
    text("standby", !r.enabled ? "– (no --repl-listen)" :
         (n.role === "leader" ? (r.standby_in_sync ? "yes" : "no") + ", lag " + bytes(r.lag_bytes)
                              : (r.caught_up ? "caught up" : "catching up")));
    text("version", s.version);
    text("uptime", duration(s.uptime_s));
    text("cores", String(s.cores));

    var hit = 0, miss = 0;
    var lookupRows = s.lookups.endpoints.map(function (e) {
      if (e.endpoint === "batch_exists" || e.endpoint === "sglang_exists") { hit += e.hit; miss += e.miss; }
      var name = e.endpoint + (e.tenant ? " (" + e.tenant + ")" : "");
      var tr = row([name, e.hit, e.miss, pct(e.hit, e.hit + e.miss)]);
      tr.setAttribute("data-lookup", name);
      return tr;
    });
    fill($("lookups").tBodies[0], lookupRows);
    text("hit-ratio", pct(hit, hit + miss));
    var a = s.allocations;
    text("allocations", "vLLM " + a.vllm.free + " / " + a.vllm.eviction + ", SGLang " +
         a.sglang.free + " / " + a.sglang.eviction);

    text("memory-pct", pct(s.memory.used, s.memory.max));
    var memoryBar = bar([["bound", s.memory.used], ["free", Math.max(0, s.memory.max - s.memory.used)]], s.memory.max);
    memoryBar.id = "memory-bar";
    $("memory-bar").replaceWith(memoryBar);
    text("memory-used", s.memory.used + " bytes (" + bytes(s.memory.used) + ")");
    text("memory-max", s.memory.max + " bytes (" + bytes(s.memory.max) + ")");

    var before = {};
    if (previous) previous.s.endpoints.forEach(function (e) { before[e.endpoint] = e; });
    var seconds = previous ? (at - previous.at) / 1000 : 0;
    fill($("endpoints").tBodies[0], s.endpoints.map(function (e) {
      var old = before[e.endpoint], rate = "–", windowP99 = null;
      if (old && seconds > 0) {
        rate = ((e.requests - old.requests) / seconds).toFixed(1);
        windowP99 = p99(e.buckets.map(function (b, i) { return b - old.buckets[i]; }), s.latency_bounds_us);
      }
      var tr = row([e.endpoint, e.requests, rate, ms(windowP99), ms(e.p99_ms), e.errors_5xx]);
      tr.setAttribute("data-endpoint", e.endpoint);
      return tr;
    }));

    var k = s.ranks;
    var rankRows = [];
    if (k.total > 0) {
      var all = row(["all " + k.total, k.pages, k.free, k.reserved, k.bound, k.incomplete,
        bar([["free", k.free], ["reserved", k.reserved], ["bound", k.bound - k.incomplete], ["incomplete", k.incomplete]], k.pages)]);
      all.setAttribute("data-rank", "all");
      rankRows.push(all);
    }
    k.rows.forEach(function (x) {
      var tr = row([x.rank, x.num_pages, x.free, x.reserved, x.bound, "",
        bar([["free", x.free], ["reserved", x.reserved], ["bound", x.bound]], x.num_pages)]);
      tr.setAttribute("data-rank", String(x.rank));
      rankRows.push(tr);
    });
    fill($("ranks").tBodies[0], rankRows);
    text("ranks-note", (k.total === 0 ? "No rank initialised. " : "") + k.keys + " keys, " +
         k.incomplete_keys + " incomplete (" + k.incomplete + " pages)" +
         (k.truncated ? "; the first " + k.rows.length + " ranks shown, the totals cover all" : ""));

    var g = s.sglang;
    var poolRows = [];
    if (g.pools > 0) {
      var sum = row(["all " + g.pools, g.pages, g.free, g.in_flight, g.bound,
        bar([["free", g.free], ["in_flight", g.in_flight], ["bound", g.bound]], g.pages)]);
      sum.setAttribute("data-pool", "all");
      poolRows.push(sum);
    }
    g.rows.forEach(function (x) {
      var name = (x.tenant ? x.tenant + "/" : "") + x.rank + " " + x.namespace;
      var tr = row([name, x.num_pages, x.free, x.in_flight, x.bound,
        bar([["free", x.free], ["in_flight", x.in_flight], ["bound", x.bound]], x.num_pages)]);
      tr.setAttribute("data-pool", name);
      poolRows.push(tr);
    });
    fill($("pools").tBodies[0], poolRows);
    text("pools-note", g.pools === 0 ? "No SGLang pool." :
         g.evicted + " keys evicted" + (g.truncated ? "; the first " + g.rows.length + " pools shown" : ""));

    var w = $("warnings");
    while (w.firstChild) w.removeChild(w.firstChild);
    if (s.warnings.lines.length === 0) w.appendChild(el("li", "No warning since start.", "muted"));
    s.warnings.lines.forEach(function (l) {
      w.appendChild(el("li", when(l.time) + "  " + l.level + "  " + l.message, l.level));
    });

    $("main").hidden = false;
    $("auth").style.display = "none";
    $("problem").style.display = "none";
    document.body.setAttribute("data-loaded", String(Number(document.body.getAttribute("data-loaded") || 0) + 1));
    previous = {s: s, at: at};
  }

  function problem(message) {
    var p = $("problem");
    p.textContent = message;
    p.style.display = "block";
  }

  function askToken(message) {
    $("main").hidden = true;
    $("auth").style.display = "block";
    text("headline", message);
    document.body.setAttribute("data-auth", "needed");
  }

  function poll() {
    var headers = {"Accept": "application/json"};
    if (token) headers["Authorization"] = "Bearer " + token;
    fetch("status.json", {headers: headers, cache: "no-store", credentials: "omit"})
      .then(function (res) {
        if (res.status === 401) {
          askToken(token ? "the token was refused" : "token needed");
          return null;
        }
        if (!res.ok) {
          return res.text().then(function (body) {
            problem("GET /status.json answered " + res.status + ": " + body.slice(0, 300));
            return null;
          });
        }
        return res.json();
      })
      .then(function (s) { if (s) render(s, Date.now()); })
      .catch(function (e) { problem("GET /status.json failed: " + e); })
      .then(function () { timer = window.setTimeout(poll, POLL_MS); });
  }

  $("auth-form").addEventListener("submit", function (e) {
    e.preventDefault();
    token = $("token").value.trim();
    try { window.sessionStorage.setItem("hf3fs-metad-token", token); } catch (err) { /* private mode */ }
    if (timer !== null) window.clearTimeout(timer);
    previous = null;
    poll();
  });
  poll();
})();
</script>
</body>
</html>
)metadpage";

}  // namespace metad::pipeline
