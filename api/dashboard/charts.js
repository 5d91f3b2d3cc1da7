// Line charts on uPlot (vendor/uplot): one Chart per metric group, fed metric rows
// ({step, values, created_at}) and redrawn at most a few times a second. uPlot draws
// 100k-point series on a canvas without trouble, so thousands of steps need no decimation.
"use strict";
const Charts = (() => {
  // Okabe-Ito: distinguishable with the common colour-vision deficiencies.
  const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000",
                   "#F0E442"];
  const HEIGHT = 200;
  const X_LABELS = { step: "step", samples: "generated samples", seconds: "wall-clock seconds" };

  /** x of each row for the axis `mode`: the step, cumulative samples, or seconds since t0. */
  function xValues(rows, mode, t0) {
    if (mode === "samples") {
      let total = 0;
      return rows.map((r) => (total += Number(r.values.samples) || 0));
    }
    if (mode === "seconds") {
      const start = t0 != null ? t0 : rows.length ? Date.parse(rows[0].created_at) : 0;
      return rows.map((r) => Math.max(0, (Date.parse(r.created_at) - start) / 1000));
    }
    return rows.map((r) => r.step);
  }

  /** Indices of rows that start a new stage (the step-0 eval row belongs to stage 0). */
  function boundaryIndices(rows) {
    const out = [];
    for (let i = 1; i < rows.length; i++) {
      const a = rows[i - 1].values.stage, b = rows[i].values.stage;
      if (a != null && b != null && a !== b) out.push(i);
    }
    return out;
  }

  // Scales that survive a flat series (clip fractions of exactly 0, an IS ratio between
  // 0.9999999 and 1): left to itself uPlot gets a (near) zero-height range, its axis ticks
  // throw "Invalid array length" and the chart stays empty.
  const yRange = (u, min, max) => {
    if (min == null || max == null) return [0, 1];
    if (max - min <= Math.max(Math.abs(min), Math.abs(max)) * 1e-6) {
      const pad = Math.abs(max) * 0.1 || 1;
      return [min - pad, max + pad];
    }
    return uPlot.rangeNum(min, max, 0.1, true);
  };
  const xRange = (u, min, max) => (min == null ? [0, 1] : min === max ? [min - 1, max + 1] : [min, max]);

  const num = (v) => (typeof v === "number" && isFinite(v) ? v : null);

  // Dashed vertical lines at stage starts, labelled with the new N.
  function boundaryPlugin(chart) {
    return {
      hooks: {
        draw: [(u) => {
          // For tests and the curious: did the last draw have data on a real y range?
          const y = u.scales.y;
          chart.el.dataset.drawn = String(u.data[0].length > 0 && Number.isFinite(y.min) && y.max > y.min);
          const ctx = u.ctx;
          ctx.save();
          ctx.strokeStyle = "#555";
          ctx.fillStyle = "#333";
          ctx.setLineDash([5, 4]);
          ctx.lineWidth = 1.5 * devicePixelRatio;
          ctx.font = `${11 * devicePixelRatio}px sans-serif`;
          for (const b of chart.boundaries) {
            const x = Math.round(u.valToPos(b.x, "x", true));
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
            ctx.fillText(b.label, x + 3 * devicePixelRatio, u.bbox.top + 12 * devicePixelRatio);
          }
          ctx.restore();
        }],
      },
    };
  }

  class Chart {
    /**
     * spec: {id, title, series: [{label, get(values) -> number, axis?: "y2", step?, dash?,
     *        fill?}], stacked?: bool, y2label?}
     */
    constructor(container, spec, mode, syncKey) {
      this.spec = spec;
      this.mode = mode;
      this.syncKey = syncKey;
      this.boundaries = [];
      this.el = Brorl.el("div", { class: "chart", id: `chart-${spec.id}`, "data-points": "0",
                                  "data-boundaries": "0" });
      container.append(this.el);
      this.raw = null;
      this.build();
      new ResizeObserver(() => this.resize()).observe(this.el);
    }

    build() {
      if (this.u) this.u.destroy();
      const s = this.spec;
      const series = [{ label: X_LABELS[this.mode] }];
      s.series.forEach((ser, i) => {
        const color = ser.color || PALETTE[i % PALETTE.length];
        series.push({
          label: ser.label, stroke: color, width: 1.5, spanGaps: true, dash: ser.dash,
          scale: ser.axis === "y2" ? "y2" : "y",
          fill: s.stacked ? color + "99" : undefined,
          points: { show: ser.points || false, size: 5 },
          paths: ser.step ? uPlot.paths.stepped({ align: 1 }) : undefined,
          // Stacked charts plot running sums; the legend shows each part's own value.
          value: (u, v, si, i) => Brorl.fmt(this.raw && i != null ? this.raw[si][i] : v),
        });
      });
      const ticks = (u, splits) => splits.map((v) => Brorl.fmt(v, 2));
      const axes = [{ label: X_LABELS[this.mode] }, { scale: "y", size: 60, values: ticks }];
      if (s.series.some((x) => x.axis === "y2")) {
        axes.push({ scale: "y2", side: 1, grid: { show: false }, label: s.y2label, size: 60,
                    values: ticks });
      }
      const opts = {
        title: s.title, width: Math.max(this.el.clientWidth, 200), height: HEIGHT,
        scales: { x: { time: false, range: xRange }, y: { range: yRange }, y2: { range: yRange } },
        series, axes, legend: { live: true },
        cursor: { sync: { key: this.syncKey } },
        plugins: [boundaryPlugin(this)],
      };
      const data = [[], ...s.series.map(() => [])];
      this.u = new uPlot(opts, data, this.el);
      if (this.rows) this.setRows(this.rows, this.t0);
    }

    setMode(mode) { this.mode = mode; this.build(); }

    resize() {
      const w = this.el.clientWidth;
      if (this.u && w > 0 && Math.abs(w - this.u.width) > 1) this.u.setSize({ width: w, height: HEIGHT });
    }

    setRows(rows, t0) {
      this.rows = rows;
      this.t0 = t0;
      const xs = xValues(rows, this.mode, t0);
      const ys = this.spec.series.map((ser) => rows.map((r) => num(ser.get(r.values))));
      this.raw = [xs, ...ys];
      let plotted = ys;
      if (this.spec.stacked) {
        // Series i is drawn at the sum of parts i..end: the first (the total) is painted
        // first and each later, lower part over it, so every band shows its own part.
        const acc = rows.map(() => 0);
        plotted = ys.slice().reverse().map((col) => col.map((v, i) => (acc[i] += v || 0))).reverse();
      }
      this.boundaries = boundaryIndices(rows).map((i) => ({ x: xs[i], label: `N=${rows[i].values.n}` }));
      this.u.setData([xs, ...plotted]);
      const points = ys.reduce((n, col) => n + col.filter((v) => v != null).length, 0);
      this.el.dataset.points = String(points);
      this.el.dataset.boundaries = String(this.boundaries.length);
      this.el.dataset.xmax = xs.length ? String(xs[xs.length - 1]) : "";

    }
  }

  /** Redraw `fn` at most every `ms` (points arriving one by one must not repaint each time). */
  function throttle(fn, ms) {
    let timer = null;
    return () => {
      if (timer) return;
      timer = setTimeout(() => { timer = null; fn(); }, ms);
    };
  }

  return { Chart, xRange, yRange, PALETTE, X_LABELS, xValues, boundaryIndices, throttle, HEIGHT };
})();
