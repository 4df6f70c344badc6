// jobvisor dashboard: live pages. A page whose <body data-live="1"> opens the server's event
// stream (data-events, Server-Sent Events) and re-reads itself, swapping in its <main>, each
// time the stream says something changed, until the server marks it not live (a job that
// finished). Only while the stream is down does it poll every two seconds instead. What the
// user typed and did not submit is put back into the fresh page; a lost session (the stream
// says "expired", or a re-read lands on the login page) is shown as "session expired — log
// in" and the refresh stops. No inline script anywhere: the Content-Security-Policy forbids
// it.
(function () {
  "use strict";
  var body = document.body;
  var indicator = document.getElementById("live");
  // Fields the user changed since the page was loaded, by name: kept across refreshes.
  var typed = {};
  function remember(e) {
    var t = e.target;
    if (t && t.name && t.type !== "hidden" && t.closest && t.closest("#main")) {
      typed[t.name] = t.value;
    }
  }
  document.addEventListener("input", remember);
  document.addEventListener("change", remember);
  function restore() {
    var main = document.getElementById("main");
    if (!main) { return; }
    Object.keys(typed).forEach(function (name) {
      var fields = main.querySelectorAll("[name]");
      for (var i = 0; i < fields.length; i++) {
        if (fields[i].name === name && fields[i].type !== "hidden") { fields[i].value = typed[name]; }
      }
    });
  }
  function setLive(on) {
    body.setAttribute("data-live", on ? "1" : "0");
    if (indicator) { indicator.className = on ? "live on" : "live"; }
  }
  function expired() {
    setLive(false);
    if (indicator) { indicator.className = "live off"; }
    if (document.getElementById("session-expired")) { return; }
    var login = body.getAttribute("data-login") || "login";
    var next = window.location.pathname + window.location.search;
    var p = document.createElement("p");
    p.id = "session-expired";
    p.className = "flash bad";
    p.appendChild(document.createTextNode("Session expired — "));
    var a = document.createElement("a");
    a.href = login + "?next=" + encodeURIComponent(next);
    a.textContent = "log in";
    p.appendChild(a);
    var main = document.getElementById("main");
    if (main) { main.insertBefore(p, main.firstChild); } else { body.appendChild(p); }
  }
  function busy() {
    var a = document.activeElement;
    return a && (a.tagName === "INPUT" || a.tagName === "SELECT" || a.tagName === "TEXTAREA");
  }
  var stream = null;
  var streaming = false;
  var loading = false;
  var again = false;
  var polling = null;
  function stop() {
    if (stream) { stream.close(); stream = null; }
    streaming = false;
    if (polling) { clearTimeout(polling); polling = null; }
  }
  // Re-reads the page and swaps in its <main>; a re-read asked for during one runs after it.
  function refresh() {
    if (body.getAttribute("data-live") !== "1") { return; }
    if (loading) { again = true; return; }
    if (busy()) { setTimeout(refresh, 1000); return; }
    loading = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Live": "1" } })
      .then(function (r) {
        var login = body.getAttribute("data-login");
        if (r.status === 401 || (r.redirected && login && new URL(r.url).pathname === login)) {
          return Promise.reject("expired");
        }
        return r.ok ? r.text() : Promise.reject(r.status);
      })
      .then(function (text) {
        loading = false;
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main) { main.replaceWith(document.adoptNode(fresh)); restore(); }
        var live = doc.body.getAttribute("data-live") === "1";
        setLive(live);
        var events = doc.body.getAttribute("data-events");
        if (!live) { stop(); return; }
        // The fresh page follows other jobs (a list) or versions: follow them.
        if (events && events !== body.getAttribute("data-events")) {
          body.setAttribute("data-events", events);
          if (stream) { stream.close(); stream = null; streaming = false; }
          connect();
        }
        if (again) { again = false; refresh(); }
      })
      .catch(function (why) {
        loading = false;
        if (why === "expired") { stop(); expired(); return; }
        if (indicator) { indicator.className = "live off"; }
      });
  }
  // The fallback while the stream is down: a re-read every two seconds.
  function poll() {
    polling = null;
    if (streaming || body.getAttribute("data-live") !== "1") { return; }
    refresh();
    polling = setTimeout(poll, 2000);
  }
  function connect() {
    var url = body.getAttribute("data-events");
    if (!url || !window.EventSource) { if (!polling) { polling = setTimeout(poll, 2000); } return; }
    stream = new EventSource(url);
    stream.onopen = function () {
      streaming = true;
      body.setAttribute("data-stream", "open");
      if (polling) { clearTimeout(polling); polling = null; }
      if (indicator && body.getAttribute("data-live") === "1") { indicator.className = "live on"; }
    };
    stream.addEventListener("change", refresh);
    stream.addEventListener("expired", function () { stop(); expired(); });
    stream.onerror = function () {
      streaming = false;
      body.setAttribute("data-stream", "down");
      // Closed for good (refused: a lost session answers 401): poll, which shows why.
      if (stream && stream.readyState === 2) { stream = null; }
      if (!polling) { polling = setTimeout(poll, 2000); }
    };
  }
  setLive(body.getAttribute("data-live") === "1");
  if (body.getAttribute("data-live") === "1") { connect(); }
})();
