// Live updates: each [data-live] region reloads its fragment every data-every ms and is
// replaced only when it changed, so nothing flickers and forms keep working.
"use strict";
(function () {
  const stamp = document.getElementById("updated");
  function refresh(region) {
    const every = parseInt(region.dataset.every || "1500", 10);
    let last;
    const tick = async () => {
      try {
        const response = await fetch(region.dataset.live, {
          credentials: "same-origin",
          headers: { "X-Requested-With": "fetch" },
          cache: "no-store",
        });
        if (response.ok) {
          const text = await response.text();
          if (text !== last) {
            region.innerHTML = text;
            last = text;
          }
          if (stamp) {
            stamp.textContent = "live · " + new Date().toLocaleTimeString();
            stamp.classList.remove("stale");
          }
        } else if (stamp) {
          stamp.textContent = "update failed: HTTP " + response.status;
          stamp.classList.add("stale");
        }
      } catch (error) {
        if (stamp) {
          stamp.textContent = "offline: " + error;
          stamp.classList.add("stale");
        }
      }
      setTimeout(tick, every);
    };
    setTimeout(tick, every);
  }
  document.querySelectorAll("[data-live]").forEach(refresh);
})();
