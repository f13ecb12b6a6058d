// Line charts on a canvas: a few series sampled at a fixed step, newest at the right edge.
// Hand-written so that the page needs nothing from outside the broker's binary.
'use strict';

window.StarlingPlot = (() => {
  const PAD = { left: 52, right: 14, top: 12, bottom: 24 };

  // The smallest of 1, 2, 5 times a power of ten at or above v, so grid labels are round.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    const f = v / p;
    const nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
    return nice * p;
  }

  function fmt(v) {
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1).replace(/\.0$/, '') + 'G';
    if (a >= 1e6) return (v / 1e6).toFixed(1).replace(/\.0$/, '') + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(1).replace(/\.0$/, '') + 'k';
    if (Number.isInteger(v)) return String(v);
    return v.toFixed(a < 1 ? 2 : 1);
  }

  // Sizes the backing store to the element's CSS size, so lines stay sharp on any screen.
  function fit(canvas) {
    const w = canvas.clientWidth;
    const h = canvas.clientHeight;
    if (w === 0 || h === 0) return null;
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { ctx, w, h };
  }

  function timeLabel(secondsAgo) {
    if (secondsAgo === 0) return 'now';
    if (secondsAgo % 60 === 0) return '-' + secondsAgo / 60 + ' min';
    return '-' + secondsAgo + ' s';
  }

  // opts: { series: [{key, label, color, width, values}], capacity, stepSeconds }.
  // After drawing, the canvas carries data-samples and data-last-<key> / data-peak-<key>:
  // what the chart shows, readable by a person in the inspector and by the browser test.
  function draw(canvas, opts) {
    const box = fit(canvas);
    if (!box) return;
    const { ctx, w, h } = box;
    const x0 = PAD.left;
    const x1 = w - PAD.right;
    const y0 = PAD.top;
    const y1 = h - PAD.bottom;
    const cap = Math.max(2, opts.capacity);
    const dx = (x1 - x0) / (cap - 1);

    let peak = 0;
    for (const s of opts.series) for (const v of s.values) peak = Math.max(peak, v);
    const top = niceMax(peak);
    const y = (v) => y1 - (v / top) * (y1 - y0);

    const style = getComputedStyle(canvas);
    const grid = style.getPropertyValue('--grid').trim() || '#e5e7eb';
    const ink = style.getPropertyValue('--ink-soft').trim() || '#6b7280';

    ctx.clearRect(0, 0, w, h);
    ctx.font = '11px system-ui, sans-serif';
    ctx.lineWidth = 1;
    ctx.strokeStyle = grid;
    ctx.fillStyle = ink;
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    const rows = 4;
    for (let i = 0; i <= rows; i++) {
      const v = (top * i) / rows;
      const yy = Math.round(y(v)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(x0, yy);
      ctx.lineTo(x1, yy);
      ctx.stroke();
      ctx.fillText(fmt(v), x0 - 6, yy);
    }
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    const span = (cap - 1) * opts.stepSeconds;
    const every = span > 240 ? 60 : 30;
    for (let ago = 0; ago <= span; ago += every) {
      const xx = Math.round(x1 - ago / opts.stepSeconds * dx) + 0.5;
      ctx.beginPath();
      ctx.moveTo(xx, y1);
      ctx.lineTo(xx, y1 + 4);
      ctx.stroke();
      ctx.fillText(timeLabel(ago), xx, y1 + 6);
    }

    for (const s of opts.series) {
      const n = s.values.length;
      if (n === 0) continue;
      const xAt = (i) => x1 - (n - 1 - i) * dx;
      ctx.beginPath();
      s.values.forEach((v, i) => (i === 0 ? ctx.moveTo(xAt(i), y(v)) : ctx.lineTo(xAt(i), y(v))));
      ctx.strokeStyle = s.color;
      ctx.lineWidth = s.width || 2;
      ctx.lineJoin = 'round';
      ctx.stroke();
      // A faint fill under the line makes a short spike visible at a glance.
      ctx.lineTo(xAt(n - 1), y1);
      ctx.lineTo(xAt(0), y1);
      ctx.closePath();
      ctx.globalAlpha = 0.08;
      ctx.fillStyle = s.color;
      ctx.fill();
      ctx.globalAlpha = 1;
    }

    canvas.dataset.samples = String(opts.series.length ? opts.series[0].values.length : 0);
    for (const s of opts.series) {
      const n = s.values.length;
      canvas.setAttribute('data-last-' + s.key, String(n ? s.values[n - 1] : 0));
      canvas.setAttribute('data-peak-' + s.key, String(n ? Math.max(...s.values) : 0));
    }
  }

  return { draw, fmt, niceMax };
})();
