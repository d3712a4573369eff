/* What is wrong with a plotly figure as drawn: called by test_notebooks_in_browser.py on each figure's graph div,
   returns {title, problems}. Values are compared in plotly's linear units: log10 of the value on a log axis, the
   category's index on a category axis. On a log axis plotly reads a shape's coordinates as values but an
   annotation's as log10 of the value, so a label given the number its line is drawn at lands elsewhere, or off the
   plot, where it can stretch the axis far past the data. */
(gd, minFill) => {
  const L = gd._fullLayout, values = {}, problems = [];
  const range = ax => ax.range.map(r => ax.r2l(r)).sort((p, q) => p - q);  // [lo, hi] in linear units
  const seq = (arr, n, start, step) =>
    arr && arr.length ? Array.from(arr) : Array.from({length: n}, (_, i) => start + i * step);
  const put = (axis, vs) => { (values[axis] = values[axis] || []).push(...vs); };

  // The plotted points of every trace, by axis.
  for (const t of gd._fullData) {
    if (t.visible !== true) continue;
    const xa = 'xaxis' + t.xaxis.slice(1), ya = 'yaxis' + t.yaxis.slice(1);
    if (t.type === 'heatmap') {
      const rows = t.z.length, cols = rows ? t.z[0].length : 0;
      put(xa, seq(t.x, cols, t.x0, t.dx));
      put(ya, seq(t.y, rows, t.y0, t.dy));
    } else if (t.type === 'bar') {  // a bar spans base .. base + size along its value axis
      const h = t.orientation === 'h', sizes = Array.from(h ? t.x : t.y);
      const base = i => t.base == null ? 0 : (t.base.length === undefined ? t.base : t.base[i]);
      put(h ? ya : xa, seq(h ? t.y : t.x, sizes.length, h ? t.y0 : t.x0, h ? t.dy : t.dx));
      put(h ? xa : ya, sizes.flatMap((s, i) => [base(i), base(i) + s]));
    } else {
      const n = (t.y || t.x || []).length;
      put(xa, seq(t.x, n, t.x0, t.dx));
      put(ya, seq(t.y, n, t.y0, t.dy));
    }
  }

  // Each axis: a finite range that holds every point, and not so wide that the points are squeezed into a corner.
  // Matched axes (shared_xaxes) share one range, which the points of all of them together must fill.
  const shared = {};
  for (const [name, raw] of Object.entries(values)) {
    const ax = L[name];
    if (!ax || ax.type === 'multicategory') continue;
    const log = ax.type === 'log', toLinear = ax.type === 'category' ? ax.d2l_noadd : ax.d2l;
    const vs = raw.filter(v => v != null && !(log && !(v > 0))).map(v => toLinear(v)).filter(Number.isFinite);
    const [lo, hi] = range(ax);
    const where = `${name} [${lo.toPrecision(4)}, ${hi.toPrecision(4)}]${log ? ' (log10 units)' : ''}`;
    if (!Number.isFinite(lo) || !Number.isFinite(hi) || !(hi > lo)) {
      problems.push(`${where} is not a finite range`);
      continue;
    }
    if (!vs.length) continue;
    const dmin = vs.reduce((p, q) => Math.min(p, q)), dmax = vs.reduce((p, q) => Math.max(p, q));
    if (dmin < lo - 1e-9 * (hi - lo) || dmax > hi + 1e-9 * (hi - lo))
      problems.push(`${where} leaves out plotted points, which span [${dmin.toPrecision(4)}, ${dmax.toPrecision(4)}]`);
    const group = shared[ax.matches || ax._id] = shared[ax.matches || ax._id] || {where, lo, hi, min: dmin, max: dmax};
    [group.min, group.max] = [Math.min(group.min, dmin), Math.max(group.max, dmax)];
  }
  for (const {where, lo, hi, min, max} of Object.values(shared)) {
    const fill = (max - min) / (hi - lo), span = `[${min.toPrecision(4)}, ${max.toPrecision(4)}]`;
    if (max > min && fill < minFill)
      problems.push(`${where} is stretched far past its points: they span ${span}, ${Math.round(100 * fill)}% of it`);
  }

  // Each annotation placed on a data axis: on the plot, and on a log axis not at the raw number of a shape's edge.
  for (const a of L.annotations || []) {
    for (const letter of ['x', 'y']) {
      const ref = a[letter + 'ref'], ax = L[letter + 'axis' + ref.slice(1)], v = a[letter];
      if (!/^[xy][0-9]*$/.test(ref) || !ax || !['linear', 'log'].includes(ax.type)) continue;  // paper, domain, ...
      const [lo, hi] = range(ax), log = ax.type === 'log';
      const at = `annotation "${a.text}" at ${letter} = ${v.toPrecision(4)}${log ? ' (log10 units)' : ''}`;
      if (v < lo || v > hi)
        problems.push(`${at} is off the plot: the ${letter} axis spans [${lo.toPrecision(4)}, ${hi.toPrecision(4)}]`);
      const edges = (L.shapes || []).filter(s => s[letter + 'ref'] === ref)
        .flatMap(s => [s[letter + '0'], s[letter + '1']]);
      if (log && edges.some(e => Math.abs(e - v) <= 1e-9 * Math.abs(e)))
        problems.push(`${at} is not at the line drawn at the value ${v.toPrecision(4)}, whose number it has`);
    }
  }

  const labels = [...gd.querySelectorAll('.xaxislayer-above text, .yaxislayer-above text')].map(e => e.textContent);
  const broken = labels.filter(s => /NaN|Infinity|undefined/.test(s));
  if (broken.length) problems.push(`tick labels that are not numbers: ${broken.slice(0, 3).join(', ')}`);
  return {title: (L.title && L.title.text) || '(untitled)', problems};
}
