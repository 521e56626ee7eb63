// Live refresh: an element with data-refresh="URL" gets its content from URL every
// data-interval seconds (same origin; the server renders and escapes the HTML).
"use strict";
(function () {
  function poll(element) {
    var url = element.getAttribute("data-refresh");
    var seconds = parseFloat(element.getAttribute("data-interval") || "5");
    if (!url || !(seconds > 0)) { return; }
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (response) {
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.text();
        })
        .then(function (html) {
          element.innerHTML = html;
          element.removeAttribute("data-stale");
        })
        .catch(function () { element.setAttribute("data-stale", "true"); })
        .finally(function () { window.setTimeout(tick, seconds * 1000); });
    }
    window.setTimeout(tick, seconds * 1000);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(poll);
  });
})();
