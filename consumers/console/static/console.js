// effectlog console: live refresh without reloading. Every few seconds the page fetches
// itself and swaps in the regions marked data-live (server-rendered HTML, no framework).
// A region holding a form someone is filling in is left alone.
(function () {
  "use strict";
  var body = document.body;
  var every = parseInt(body.getAttribute("data-refresh-ms"), 10) || 2000;
  var live = document.getElementById("live");
  var busy = false;

  function say(state, text) {
    if (!live) return;
    live.setAttribute("data-state", state);
    live.textContent = text;
  }

  function inUse(region) {
    if (region.contains(document.activeElement) && document.activeElement !== body) return true;
    var fields = region.querySelectorAll("input:not([type=hidden]), textarea");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value) return true;
    }
    return false;
  }

  function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    fetch(window.location.href, {cache: "no-store", credentials: "same-origin"})
      .then(function (response) {
        if (!response.ok && response.status !== 404 && response.status !== 503) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        var regions = document.querySelectorAll("[data-live]");
        for (var i = 0; i < regions.length; i++) {
          var old = regions[i];
          var next = old.id && fresh.getElementById(old.id);
          if (next && next.innerHTML !== old.innerHTML && !inUse(old)) {
            old.innerHTML = next.innerHTML;
          }
        }
        say("ok", "live · " + new Date().toLocaleTimeString());
      })
      .catch(function () { say("down", "offline · retrying"); })
      .then(function () { busy = false; });
  }

  say("ok", "live");
  window.setInterval(refresh, every);
  document.addEventListener("visibilitychange", refresh);
})();
