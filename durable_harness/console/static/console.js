// durable-harness console: live updates (progressive enhancement; every page works without it).
// The session page's #live region names a fragment URL and an event-stream URL: on every
// event of the session's live generation the fragment is fetched again and swapped in.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource || !window.fetch) {
    return;
  }
  var fragment = live.getAttribute("data-fragment");
  var busy = false;
  var again = false;
  function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    fetch(fragment, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html !== null) {
          live.innerHTML = html;
          live.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (again) {
          again = false;
          window.setTimeout(refresh, 150);
        }
      });
  }
  var source = new EventSource(live.getAttribute("data-events"));
  source.addEventListener("update", refresh);
  source.addEventListener("state", refresh);
})();
