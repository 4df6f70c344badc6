// jobvisor dashboard: live pages. A page whose <body data-live="1"> re-reads itself every
// two seconds and swaps in its <main>, until the server marks it not live (a job that
// finished). No inline script anywhere: the Content-Security-Policy forbids it.
(function () {
  "use strict";
  var body = document.body;
  var indicator = document.getElementById("live");
  function setLive(on) {
    body.setAttribute("data-live", on ? "1" : "0");
    if (indicator) { indicator.className = on ? "live on" : "live"; }
  }
  function busy() {
    var a = document.activeElement;
    return a && (a.tagName === "INPUT" || a.tagName === "SELECT" || a.tagName === "TEXTAREA");
  }
  function tick() {
    if (body.getAttribute("data-live") !== "1") { return; }
    if (busy()) { setTimeout(tick, 2000); return; }
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Live": "1" } })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main) { main.replaceWith(document.adoptNode(fresh)); }
        setLive(doc.body.getAttribute("data-live") === "1");
        setTimeout(tick, 2000);
      })
      .catch(function () {
        if (indicator) { indicator.className = "live off"; }
        setTimeout(tick, 5000);
      });
  }
  setLive(body.getAttribute("data-live") === "1");
  setTimeout(tick, 2000);
})();
