// Inline SVG plots for the gridbot console: line charts over time, bar histograms and a scatter, drawn
// with the DOM (no library), so they redraw in place on every poll.
"use strict";

const Plot = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 640, H = 260, M = {l: 56, r: 12, t: 12, b: 34};
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

  function el(name, attrs, text) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) hi = lo + 1;
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(s => s * mag).find(s => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function fmtNum(v) {
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
    if (a >= 1e3) return (v / 1e3).toFixed(a >= 1e4 ? 0 : 1) + "k";
    if (a > 0 && a < 1) return v.toPrecision(2);
    return String(Math.round(v * 100) / 100);
  }

  function fmtTime(span) {
    return t => new Date(t * 1000).toTimeString().slice(0, span < 600 ? 8 : 5);
  }

  function frame(svg, title) {
    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("role", "img");
    svg.setAttribute("preserveAspectRatio", "xMidYMid meet");
    if (title) svg.appendChild(el("title", {}, title));
  }

  function axes(svg, x0, x1, y0, y1, xfmt, yLabel) {
    const sx = v => M.l + (v - x0) / (x1 - x0 || 1) * (W - M.l - M.r);
    const sy = v => H - M.b - (v - y0) / (y1 - y0 || 1) * (H - M.t - M.b);
    const g = el("g", {class: "axes"});
    for (const v of niceTicks(y0, y1, 5)) {
      g.appendChild(el("line", {x1: M.l, x2: W - M.r, y1: sy(v), y2: sy(v), class: "grid"}));
      g.appendChild(el("text", {x: M.l - 6, y: sy(v) + 4, "text-anchor": "end"}, fmtNum(v)));
    }
    for (const v of niceTicks(x0, x1, 6)) {  // a label at an edge is anchored inside the plot
      const x = sx(v), anchor = x > W - M.r - 30 ? "end" : x < M.l + 20 ? "start" : "middle";
      g.appendChild(el("text", {x, y: H - M.b + 16, "text-anchor": anchor}, xfmt(v)));
    }
    g.appendChild(el("line", {x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, class: "axis"}));
    g.appendChild(el("line", {x1: M.l, x2: M.l, y1: M.t, y2: H - M.b, class: "axis"}));
    if (yLabel) g.appendChild(el("text", {x: 12, y: M.t + (H - M.t - M.b) / 2, "text-anchor": "middle",
      transform: `rotate(-90 12 ${M.t + (H - M.t - M.b) / 2})`}, yLabel));
    svg.appendChild(g);
    return [sx, sy];
  }

  function legend(svg, names) {
    if (names.length < 2) return;
    const g = el("g", {class: "legend"});
    names.forEach((n, i) => {
      const x = M.l + 8 + (i % 4) * 140, y = M.t + 10 + Math.floor(i / 4) * 14;
      g.appendChild(el("rect", {x, y: y - 8, width: 10, height: 10, fill: COLORS[i % COLORS.length]}));
      g.appendChild(el("text", {x: x + 14, y: y + 1}, n.length > 18 ? n.slice(0, 17) + "…" : n));
    });
    svg.appendChild(g);
  }

  // series: [{name, points: [[x, y], ...]}]; opts: {yLabel, time (x are epoch seconds), markers: [{x, label}],
  // step (draw as steps)}
  function lines(svg, series, opts) {
    opts = opts || {};
    frame(svg, opts.title);
    const all = series.flatMap(s => s.points);
    if (!all.length) {
      svg.appendChild(el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty"}, opts.empty || "no data yet"));
      svg.dataset.points = "0";
      return;
    }
    const xs = all.map(p => p[0]), ys = all.map(p => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
    const y1 = Math.max(...ys, 1) * 1.05;
    const [sx, sy] = axes(svg, x0, x1, 0, y1, opts.time ? fmtTime(x1 - x0) : fmtNum, opts.yLabel);
    for (const m of opts.markers || []) {
      if (m.x < x0 || m.x > x1) continue;
      svg.appendChild(el("line", {x1: sx(m.x), x2: sx(m.x), y1: M.t, y2: H - M.b, class: "marker"}));
      svg.appendChild(el("text", {x: sx(m.x) + 4, y: M.t + 10, class: "marker-label"}, m.label));
    }
    series.forEach((s, i) => {
      if (!s.points.length) return;
      const d = s.points.map((p, k) => `${k ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
      svg.appendChild(el("path", {d, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 2,
        class: "series", "data-name": s.name}));
    });
    legend(svg, series.map(s => s.name));
    const first = series[0].points;
    svg.dataset.points = String(all.length);
    svg.dataset.last = first.length ? String(first[first.length - 1][1]) : "";
  }

  // bins: [{label, value}]
  function bars(svg, bins, opts) {
    opts = opts || {};
    frame(svg, opts.title);
    if (!bins.length) {
      svg.appendChild(el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty"}, "no data yet"));
      svg.dataset.total = "0";
      return;
    }
    const y1 = Math.max(...bins.map(b => b.value), 1) * 1.05;
    const [, sy] = axes(svg, 0, 1, 0, y1, () => "", opts.yLabel);
    const bw = (W - M.l - M.r) / bins.length;
    bins.forEach((b, i) => {
      const x = M.l + i * bw;
      svg.appendChild(el("rect", {x: x + 1, y: sy(b.value), width: Math.max(1, bw - 2), height: H - M.b - sy(b.value),
        fill: COLORS[0], "data-value": b.value}, undefined)).appendChild(el("title", {}, `${b.label}: ${b.value}`));
      if (bins.length <= 16 || i % Math.ceil(bins.length / 12) === 0) {
        svg.appendChild(el("text", {x: x + bw / 2, y: H - M.b + 16, "text-anchor": "middle"}, b.label));
      }
    });
    svg.dataset.total = String(bins.reduce((a, b) => a + b.value, 0));
  }

  // points: [{x, y, label, chosen}]
  function scatter(svg, points, opts) {
    opts = opts || {};
    frame(svg, opts.title);
    if (!points.length) {
      svg.appendChild(el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty"}, "no frontier"));
      return;
    }
    const xs = points.map(p => p.x).filter(Number.isFinite), ys = points.map(p => p.y).filter(Number.isFinite);
    const [sx, sy] = axes(svg, Math.min(...xs, 0), Math.max(...xs, 1) * 1.05, 0, Math.max(...ys, 1e-9) * 1.1,
      fmtNum, opts.yLabel);
    for (const p of points) {
      if (!Number.isFinite(p.x) || !Number.isFinite(p.y)) continue;
      const c = el("circle", {cx: sx(p.x), cy: sy(p.y), r: p.chosen ? 7 : 4, class: p.chosen ? "chosen" : "point"});
      c.appendChild(el("title", {}, p.label));
      svg.appendChild(c);
    }
    if (opts.xLabel) svg.appendChild(el("text", {x: W - M.r, y: H - 4, "text-anchor": "end"}, opts.xLabel));
  }

  return {lines, bars, scatter, fmtNum, COLORS};
})();
