// Live updates by polling, two ways:
// - data-live="<ms>": the element is replaced by the same element of a fresh copy of the
//   page, fetched with the session cookie (small pages);
// - data-live-parts="<ms>" with data-src and data-version: the page's JSON is asked for
//   what changed since the version held (live_parts.py): 304 when nothing did, else the
//   layout of each list and only the parts (rows, figures) that changed.
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
  function fragment(html) {
    var t = document.createElement("template");
    t.innerHTML = html;
    return t.content.firstElementChild;
  }
  function held(region, id) {
    return region.querySelector('[data-part="' + CSS.escape(id) + '"]');
  }
  function refreshParts(region) {
    var src = region.dataset.src;
    var url = src + (src.indexOf("?") < 0 ? "?" : "&") + "since=" + encodeURIComponent(region.dataset.version);
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.status === 200 ? r.json() : null; })
      .then(function (body) {
        document.body.dataset.refreshed = String(Date.now());
        if (body === null) return;
        var parts = body.parts;
        Object.keys(body.sections).forEach(function (name) {
          var list = region.querySelector('[data-layout="' + CSS.escape(name) + '"]');
          if (!list) return;
          var rows = body.sections[name].parts.map(function (id) {
            return id in parts ? fragment(parts[id]) : held(list, id);
          });
          list.replaceChildren.apply(list, rows.filter(Boolean));
        });
        Object.keys(parts).forEach(function (id) {  // parts outside the lists
          var old = held(region, id);
          if (old && !old.closest("[data-layout]")) old.replaceWith(fragment(parts[id]));
        });
        var updated = document.getElementById("updated");
        if (updated) updated.textContent = body.updated;
        region.dataset.version = body.version;
      })
      .catch(function () {});
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(function (region) {
      var every = parseInt(region.dataset.live, 10) || 2000;
      setInterval(function () { if (!document.hidden) refresh(region); }, every);
    });
    document.querySelectorAll("[data-live-parts]").forEach(function (region) {
      var every = parseInt(region.dataset.liveParts, 10) || 3000;
      setInterval(function () { if (!document.hidden) refreshParts(region); }, every);
    });
  });
})();
