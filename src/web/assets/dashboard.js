// jobvisor dashboard: live pages. A page whose <body data-live="1"> re-reads itself every
// two seconds and swaps in its <main>, until the server marks it not live (a job that
// finished). What the user typed and did not submit is put back into the fresh page; a
// lost session (the re-read lands on the login page) is shown as "session expired — log
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
  function tick() {
    if (body.getAttribute("data-live") !== "1") { return; }
    if (busy()) { setTimeout(tick, 2000); return; }
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Live": "1" } })
      .then(function (r) {
        var login = body.getAttribute("data-login");
        if (r.status === 401 || (r.redirected && login && new URL(r.url).pathname === login)) {
          return Promise.reject("expired");
        }
        return r.ok ? r.text() : Promise.reject(r.status);
      })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main) { main.replaceWith(document.adoptNode(fresh)); restore(); }
        setLive(doc.body.getAttribute("data-live") === "1");
        setTimeout(tick, 2000);
      })
      .catch(function (why) {
        if (why === "expired") { expired(); return; }
        if (indicator) { indicator.className = "live off"; }
        setTimeout(tick, 5000);
      });
  }
  setLive(body.getAttribute("data-live") === "1");
  setTimeout(tick, 2000);
})();
