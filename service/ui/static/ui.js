// moeproxy triage page: draws the metric plots from the embedded JSON with the locally served
// plotly.min.js, draws the "other metrics" only when that section is opened, and polls the run's
// state while it is live, reloading when a new evaluation or new metrics arrived.
(function () {
  "use strict";

  function layoutFor(fig) {
    var shapes = fig.change_points.map(function (step) {
      return {type: "line", xref: "x", yref: "paper", x0: step, x1: step, y0: 0, y1: 1,
              line: {color: "#c0392b", width: 1.5, dash: "dot"}};
    });
    var annotations = fig.change_points.map(function (step) {
      return {x: step, y: 1, xref: "x", yref: "paper", text: "change @" + step, showarrow: false,
              yanchor: "bottom", font: {size: 10, color: "#c0392b"}};
    });
    var title = fig.name + (fig.canonical && fig.canonical !== fig.name ? "  (" + fig.canonical + ")" : "");
    return {
      title: {text: title, font: {size: 13}, x: 0.01, xanchor: "left"},
      margin: {l: 55, r: 15, t: 36, b: 36}, height: 260,
      xaxis: {title: {text: "step", font: {size: 11}}, zeroline: false},
      yaxis: {zeroline: false, exponentformat: "e"},
      yaxis2: {overlaying: "y", range: [-0.1, 1.1], visible: false, fixedrange: true},
      showlegend: true, legend: {orientation: "h", y: -0.25, font: {size: 10}},
      shapes: shapes, annotations: annotations,
    };
  }

  function draw(group, figures) {
    if (!window.Plotly) { return; }
    figures.forEach(function (fig, i) {
      var el = document.getElementById("plot-" + group + "-" + i);
      if (!el || el.dataset.drawn) { return; }
      el.dataset.drawn = "1";
      window.Plotly.newPlot(el, fig.traces, layoutFor(fig), {displaylogo: false, responsive: true});
    });
  }

  function poll(page) {
    var every = 1000 * (parseFloat(page.dataset.pollS) || 5);
    var url = "/runs/" + page.dataset.runId + "/state";
    window.setInterval(function () {
      fetch(url, {credentials: "same-origin", cache: "no-store"})
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (state) {
          if (state && state.version !== page.dataset.version) { window.location.reload(); }
        })
        .catch(function () { /* the server may be restarting: try again next time */ });
    }, every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var page = document.getElementById("run-page");
    var data = document.getElementById("plot-data");
    if (!page || !data) { return; }
    var figures = JSON.parse(data.textContent);
    draw("key", figures.key);
    var other = document.getElementById("other-metrics");
    if (other) {
      other.addEventListener("toggle", function () { if (other.open) { draw("other", figures.other); } });
    }
    if (page.dataset.live === "1") { poll(page); }
  });
})();
