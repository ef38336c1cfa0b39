// trainsentry console: live updates (server-sent events → the page's live region is fetched
// again and swapped), ages that tick, and j/k to move between incidents. No framework; the
// fetched HTML is drawn and escaped by the server's templates.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var state = document.getElementById("live-state");

  function say(text) { if (state) { state.textContent = text; } }

  function ageText(seconds) {
    if (seconds < 60) { return seconds + " s"; }
    var minutes = Math.floor(seconds / 60);
    if (minutes < 60) { return minutes + " min"; }
    var hours = Math.floor(minutes / 60);
    if (hours < 48) { return hours + " h" + (minutes % 60 ? " " + (minutes % 60) + " min" : ""); }
    return Math.floor(hours / 24) + " d " + (hours % 24) + " h";
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll(".age time[datetime]").forEach(function (el) {
      var started = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(started)) { el.textContent = ageText(Math.max(0, Math.floor((now - started) / 1000))); }
    });
  }
  setInterval(tick, 30000);

  if (live && window.EventSource && window.fetch) {
    var busy = false;
    var again = false;
    var refresh = function () {
      if (busy) { again = true; return; }
      busy = true;
      fetch(live.getAttribute("data-fragment"), { credentials: "same-origin" })
        .then(function (r) {
          if (r.status === 401) { window.location.reload(); throw new Error("signed out"); }
          if (!r.ok) { throw new Error("HTTP " + r.status); }
          return r.text();
        })
        .then(function (html) {
          // keep the keyboard where it was: the focused card, found again by its alert id
          var focused = document.activeElement;
          var id = focused && live.contains(focused) ? focused.getAttribute("data-alert-id") : null;
          live.innerHTML = html;
          if (id) {
            var card = live.querySelector('a.card[data-alert-id="' + id.replace(/[^0-9]/g, "") + '"]');
            if (card) { card.focus(); }
          }
          live.setAttribute("data-updated", String(Date.now()));
          say("live: updated " + new Date().toLocaleTimeString());
        })
        .catch(function (err) { say("live: " + err.message); })
        .then(function () {
          busy = false;
          if (again) { again = false; refresh(); }
        });
    };
    var since = live.getAttribute("data-marker") || "";
    var source = new EventSource("/ui/events?since=" + encodeURIComponent(since));
    source.addEventListener("open", function () {
      live.setAttribute("data-stream", "open");
      say("live");
    });
    source.addEventListener("change", refresh);
    source.addEventListener("error", function () {
      live.setAttribute("data-stream", "reconnecting");
      say("live: reconnecting…");
    });
  } else {
    say("live updates need a newer browser: reload to see changes");
  }

  document.addEventListener("keydown", function (event) {
    var target = event.target;
    if (event.ctrlKey || event.metaKey || event.altKey) { return; }
    if (target && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(target.tagName)) { return; }
    if (event.key !== "j" && event.key !== "k") { return; }
    var cards = Array.prototype.slice.call(document.querySelectorAll("a.card"));
    if (!cards.length) { return; }
    var at = cards.indexOf(document.activeElement);
    var next = event.key === "j" ? Math.min(cards.length - 1, at + 1) : Math.max(0, at - 1);
    cards[next].focus();
    event.preventDefault();
  });
})();
