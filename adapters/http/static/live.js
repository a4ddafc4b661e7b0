// Live updates by polling: every element with data-live="<ms>" is replaced by the same
// element of a fresh copy of the page, fetched with the session cookie.
(function () {
  "use strict";
  function refresh(region) {
    fetch(window.location.href, { headers: { "X-Live": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById(region.id);
        if (fresh) region.innerHTML = fresh.innerHTML;
        document.body.dataset.refreshed = String(Date.now());
      })
      .catch(function () {});
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(function (region) {
      var every = parseInt(region.dataset.live, 10) || 2000;
      setInterval(function () { if (!document.hidden) refresh(region); }, every);
    });
  });
})();
