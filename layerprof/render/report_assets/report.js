// layerprof report: draws the icicle, the timeline and the table from the JSON in #layerprof-data.
// Every number arrives with its printed form ("shown"), so this script formats no number itself.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("layerprof-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  const nodes = data.nodes;
  nodes.forEach((node, i) => { node.index = i; node.children = []; });
  nodes.forEach((node) => { if (node.parent !== null) nodes[node.parent].children.push(node); });
  const root = nodes[0];
  const state = { metric: data.metrics.length ? data.metrics[0].name : null, zoom: root,
                  sortBy: null, sortDesc: true, filter: "" };
  const tooltip = document.getElementById("tooltip");

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function value(node) { const v = node.values[state.metric]; return typeof v === "number" && v > 0 ? v : 0; }
  function hue(text) { let h = 0; for (const c of text) h = (h * 31 + c.charCodeAt(0)) % 360; return h; }
  function color(node) { return "hsl(" + hue(node.type) + ", 55%, " + (72 - Math.min(node.depth, 6) * 3) + "%)"; }
  function fullName(node) { return node.name || node.type; }
  // A count and its noun, singular for exactly one (units.format_counted, for the text drawn here).
  function counted(count, noun) { return count + " " + noun + (count === 1 ? "" : "s"); }
  // ``label`` cut to what fits ``width`` px of 11 px text (about 6.5 px a character), or null if under 4 fit.
  function fitted(label, width) {
    const room = Math.floor((width - 8) / 6.5);
    if (room <= 3) return null;
    return room >= label.length ? label : label.slice(0, room - 1) + "\u2026";
  }

  function showTooltip(event, lines) {
    clear(tooltip);
    lines.forEach(([label, text], i) => {
      if (i) tooltip.appendChild(document.createElement("br"));
      const b = document.createElement("b"); b.textContent = label; tooltip.appendChild(b);
      tooltip.appendChild(document.createTextNode(" " + text));
    });
    tooltip.hidden = false;
    tooltip.style.left = Math.min(event.clientX + 12, window.innerWidth - 300) + "px";
    tooltip.style.top = (event.clientY + 12) + "px";
  }
  function hideTooltip() { tooltip.hidden = true; }
  function nodeLines(node) {
    const lines = [[fullName(node), node.type]];
    if (node.summed) lines.push(["sum of its children:", "not called itself"]);
    data.columns.concat(data.metrics).forEach((c) => {
      if (c.name === "note") { if (node.note) lines.push(["note:", node.note]); return; }
      if (!lines.some((l) => l[0] === c.label)) lines.push([c.label, node.shown[c.name]]);
    });
    return lines;
  }

  // -- icicle: a row per depth below the zoomed node, widths in proportion to the metric ------------------
  // Children narrower than MIN_CELL pixels are drawn as one "other" cell per parent: nothing is dropped, and
  // the number of cells stays bounded by the width of the page, however many modules the model has.
  const MIN_CELL = 1;
  function layout(node, x0, x1, out) {
    out.push({ node: node, depth: node.depth, x0: x0, x1: x1 });
    const kids = node.children.filter((c) => value(c) > 0);
    const total = Math.max(value(node), kids.reduce((s, c) => s + value(c), 0));
    if (!(total > 0)) return out;
    const scale = (x1 - x0) / total, small = [];
    let x = x0, rest = 0;
    kids.forEach((child) => {
      const w = value(child) * scale;
      if (w >= MIN_CELL) { layout(child, x, x + w, out); x += w; } else { small.push(child); rest += w; }
    });
    if (small.length) out.push({ node: node, other: small, depth: node.depth + 1, x0: x, x1: x + rest });
    return out;
  }
  function otherLines(cell) {
    const ranked = cell.other.slice().sort((a, b) => value(b) - value(a));
    const lines = [["other", counted(cell.other.length, "module") + " of " + fullName(cell.node) + ", each under " + MIN_CELL + " px"]];
    ranked.slice(0, 5).forEach((n) => lines.push([fullName(n), n.shown[state.metric]]));
    if (ranked.length > 5) lines.push(["\u2026", (ranked.length - 5) + " more"]);
    return lines;
  }
  let icicleCells = [];
  function drawIcicle() {
    const svg = document.getElementById("icicle");
    clear(svg);
    const width = svg.clientWidth || 1000, rowHeight = 22;
    const cells = icicleCells = state.metric ? layout(state.zoom, 0, width, []) : [];
    const base = state.zoom.depth;
    const depth = cells.reduce((d, c) => Math.max(d, c.depth - base), 0);
    svg.setAttribute("viewBox", "0 0 " + width + " " + (depth + 1) * rowHeight);
    svg.setAttribute("height", (depth + 1) * rowHeight);
    svg.setAttribute("data-zoom", state.zoom.name);
    const fragment = document.createDocumentFragment();
    cells.forEach((cell, i) => {
      const node = cell.node, other = !!cell.other;
      const g = el("g", { class: other ? "cell other" : node.summed ? "cell summed" : "cell", "data-cell": i,
                          transform: "translate(" + cell.x0 + "," + (cell.depth - base) * rowHeight + ")" }, fragment);
      if (!other) g.setAttribute("data-name", node.name);
      el("rect", { width: Math.max(cell.x1 - cell.x0, 0), height: rowHeight, fill: other ? "#d5d9e0" : color(node) }, g);
      const label = other ? "other (" + cell.other.length + ")" : node === state.zoom ? fullName(node) : node.label;
      const shown = fitted(label, cell.x1 - cell.x0);
      if (shown) el("text", { x: 4, y: 15 }, g).textContent = shown;
      // the name, even where the box is narrow
      el("title", {}, g).textContent = other ? counted(cell.other.length, "module") + " under " + fullName(node) : fullName(node);
    });
    svg.appendChild(fragment);
    const crumbs = document.getElementById("crumbs");
    const path = []; for (let n = state.zoom; n; n = n.parent === null ? null : nodes[n.parent]) path.unshift(fullName(n));
    crumbs.textContent = path.join(" \u203A ") + " \u2014 " + (state.zoom.shown[state.metric] || "");
  }
  function icicleCell(event) {
    const g = event.target.closest ? event.target.closest("g.cell") : null;
    return g ? icicleCells[+g.getAttribute("data-cell")] : null;
  }
  function wireIcicle() {
    const svg = document.getElementById("icicle");
    svg.addEventListener("click", (event) => {
      const cell = icicleCell(event); if (!cell) return;
      const node = cell.node;  // an "other" cell zooms to its parent, where its modules get wider
      zoomTo(node === state.zoom && !cell.other && node.parent !== null ? nodes[node.parent] : node);
    });
    svg.addEventListener("mousemove", (event) => {
      const cell = icicleCell(event);
      if (cell) showTooltip(event, cell.other ? otherLines(cell) : nodeLines(cell.node)); else hideTooltip();
    });
    svg.addEventListener("mouseleave", hideTooltip);
  }
  function zoomTo(node) { state.zoom = node; hideTooltip(); drawIcicle(); }

  // -- timeline: forward and backward lanes, a row per depth ----------------------------------------------
  // Slices under MIN_SLICE pixels that follow one another in a row are drawn as one grey run ("N calls").
  const MIN_SLICE = 1;
  let timelineItems = [];
  function timelineRuns(lane, scale) {
    const rows = new Map(), items = [];
    lane.forEach((s) => { if (!rows.has(s.depth)) rows.set(s.depth, []); rows.get(s.depth).push(s); });
    rows.forEach((row) => {
      let run = null;
      const flush = () => { if (run) { items.push(run.slices.length === 1 ? { slice: run.slices[0] } : run); run = null; } };
      row.forEach((s) => {
        if (s.duration * scale >= MIN_SLICE) { flush(); items.push({ slice: s }); return; }
        if (run && s.start * scale <= run.end * scale + MIN_SLICE) { run.slices.push(s); run.end = Math.max(run.end, s.start + s.duration); return; }
        flush(); run = { slices: [s], start: s.start, end: s.start + s.duration, depth: s.depth };
      });
      flush();
    });
    return items;
  }
  function drawTimeline() {
    const svg = document.getElementById("timeline");
    clear(svg);
    timelineItems = [];
    const slices = data.timeline.slices;
    document.getElementById("timeline-caption").textContent = slices.length
      ? "(the last profiled step, one row per depth)" : data.untimed ? `(${data.untimed})` : "(no calls recorded)";
    if (!slices.length) { svg.setAttribute("height", 0); return; }
    const width = svg.clientWidth || 1000, left = 70, rowHeight = 14;
    const end = slices.reduce((m, s) => Math.max(m, s.start + s.duration), 0) || 1;
    const scale = (width - left - 4) / end;
    const fragment = document.createDocumentFragment();
    let y = 0;
    ["forward", "backward"].forEach((phase) => {
      const lane = slices.filter((s) => s.phase === phase);
      if (!lane.length) return;
      const depths = lane.reduce((m, s) => Math.max(m, s.depth), 0) + 1;
      el("text", { x: 4, y: y + 12, class: "lane-label" }, fragment).textContent = phase;
      timelineRuns(lane, scale).forEach((item) => {
        const s = item.slice, i = timelineItems.push({ phase: phase, item: item }) - 1;
        const g = el("g", { class: s ? "slice" : "slice run", "data-item": i }, fragment);
        const start = s ? s.start : item.start, duration = s ? s.duration : item.end - item.start;
        const depth = s ? s.depth : item.depth;
        const x = left + start * scale, w = Math.max(duration * scale, 0.5);
        el("rect", { x: x, y: y + depth * rowHeight, width: w, height: rowHeight - 1,
                     fill: s ? "hsl(" + hue(s.type) + ", 55%, " + (phase === "forward" ? 68 : 58) + "%)" : "#c3c8d0" }, g);
        const shown = s ? fitted(s.name.split(".").pop(), w - 2) : null;  // cut to its slice, as in the icicle
        if (shown) el("text", { x: x + 3, y: y + depth * rowHeight + 11 }, g).textContent = shown;
      });
      y += depths * rowHeight + 8;
    });
    svg.appendChild(fragment);
    svg.setAttribute("viewBox", "0 0 " + width + " " + y);
    svg.setAttribute("height", y);
  }
  function wireTimeline() {
    const svg = document.getElementById("timeline");
    svg.addEventListener("mousemove", (event) => {
      const g = event.target.closest ? event.target.closest("g.slice") : null;
      if (!g) { hideTooltip(); return; }
      const { phase, item } = timelineItems[+g.getAttribute("data-item")];
      if (item.slice) { showTooltip(event, [[item.slice.name, item.slice.type], [phase, item.slice.shown]]); return; }
      const first = item.slices[0], last = item.slices[item.slices.length - 1];
      showTooltip(event, [[counted(item.slices.length, "call"), "each under " + MIN_SLICE + " px"],
                          ["from", first.name], ["to", last.name]]);
    });
    svg.addEventListener("mouseleave", hideTooltip);
  }

  // -- table: click a header to sort, type to filter; rows are added PAGE at a time (a 10,000-module model's
  // full table would take seconds to lay out on every keystroke) --------------------------------------------
  const PAGE = 200;
  const columns = [{ name: "name", label: "Name" }, { name: "type", label: "Type" }].concat(data.columns);
  const haystack = nodes.map((n) => fullName(n).toLowerCase() + "\n" + n.type.toLowerCase());
  let tableRows = [];
  function drawHead() {
    const head = document.querySelector("#records thead");
    clear(head);
    const tr = document.createElement("tr");
    columns.forEach((c) => {
      const th = document.createElement("th");
      th.textContent = c.label; th.className = c.name === "name" || c.name === "type" ? c.name : c.numeric === false ? "text" : "";
      if (state.sortBy === c.name) th.classList.add(state.sortDesc ? "sorted-desc" : "sorted-asc");
      th.addEventListener("click", () => { state.sortDesc = state.sortBy === c.name ? !state.sortDesc : c.name !== "name" && c.name !== "type";
                                           state.sortBy = c.name; drawHead(); drawTable(); });
      tr.appendChild(th);
    });
    head.appendChild(tr);
  }
  function tableRow(n) {
    const row = document.createElement("tr");
    row.setAttribute("data-node", n.index);
    columns.forEach((c) => {
      const td = document.createElement("td");
      td.className = c.name === "name" || c.name === "type" ? c.name : c.numeric === false ? "text" : "";
      if (c.name === "name") { td.textContent = td.title = fullName(n); td.style.paddingLeft = (8 + 12 * n.depth) + "px"; }
      else if (c.name === "note") { td.textContent = n.note_short; td.title = n.note; }
      else td.textContent = c.name === "type" ? n.type : n.shown[c.name];
      row.appendChild(td);
    });
    return row;
  }
  function showRows(count) {
    const body = document.querySelector("#records tbody"), fragment = document.createDocumentFragment();
    const shown = body.childElementCount;
    tableRows.slice(shown, shown + count).forEach((n) => fragment.appendChild(tableRow(n)));
    body.appendChild(fragment);
    const left = tableRows.length - body.childElementCount, more = document.getElementById("more");
    more.hidden = left <= 0;
    more.textContent = "show " + Math.min(left, PAGE) + " more (" + left + " left)";
  }
  function drawTable() {
    clear(document.querySelector("#records tbody"));
    const needle = state.filter.toLowerCase();
    let rows = needle ? nodes.filter((n) => haystack[n.index].includes(needle)) : nodes;
    if (state.sortBy) {
      const key = state.sortBy, sign = state.sortDesc ? -1 : 1;
      const get = (n) => key === "name" ? fullName(n) : key === "type" ? n.type : key === "note" ? n.note || null : n.values[key];
      rows = rows.slice().sort((a, b) => {
        const x = get(a), y = get(b);
        if (x === y) return a.index - b.index;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * sign;
      });
    }
    tableRows = rows;
    showRows(PAGE);
    document.getElementById("count").textContent = rows.length + " of " + counted(nodes.length, "module");
  }
  function wireTable() {
    document.querySelector("#records tbody").addEventListener("click", (event) => {
      const row = event.target.closest ? event.target.closest("tr") : null;
      if (row) zoomTo(nodes[+row.getAttribute("data-node")]);
    });
    document.getElementById("more").addEventListener("click", () => showRows(PAGE));
  }

  // -- wiring ---------------------------------------------------------------------------------------------
  document.getElementById("subtitle").textContent = data.subtitle;
  const select = document.getElementById("metric");
  data.metrics.forEach((m) => { const o = document.createElement("option"); o.value = m.name; o.textContent = m.label; select.appendChild(o); });
  select.addEventListener("change", () => { state.metric = select.value; drawIcicle(); });
  document.getElementById("zoom-out").addEventListener("click", () => zoomTo(root));
  document.getElementById("filter").addEventListener("input", (event) => { state.filter = event.target.value; drawTable(); });
  window.addEventListener("resize", () => { drawIcicle(); drawTimeline(); });
  wireIcicle(); wireTimeline(); wireTable();
  drawIcicle(); drawTimeline(); drawHead(); drawTable();

  // A check a headless browser can run: open the file with #selftest and read #selftest from the DOM.
  if (location.hash === "#selftest") {
    const result = { names: [], others: [], summed: [], tooltip: null, zoomedTo: null, cellsAfterZoom: 0, metrics: [],
                     rows: 0, sortedFirst: null, filtered: 0, slices: document.querySelectorAll("#timeline g.slice").length,
                     tableNames: Array.from(document.querySelectorAll("#records tbody td.name")).map((td) => td.textContent),
                     elements: Array.from(new Set(Array.from(document.querySelectorAll("body *")).map((e) => e.localName))).sort() };
    document.querySelectorAll("#icicle g.cell").forEach((g) => {
      const cell = icicleCells[+g.getAttribute("data-cell")];
      if (cell.other) result.others.push([cell.node.name, cell.other.length]); else result.names.push(cell.node.name);
      if (g.classList.contains("summed")) result.summed.push(g.getAttribute("data-name"));
    });
    const first = document.querySelector("#icicle g.cell");
    first.dispatchEvent(new MouseEvent("mousemove", { bubbles: true, clientX: 20, clientY: 20 }));
    result.tooltip = tooltip.hidden ? null : tooltip.textContent;
    first.dispatchEvent(new MouseEvent("mouseleave"));
    const target = Array.from(document.querySelectorAll("#icicle g.cell")).find((g) => g.getAttribute("data-name") !== root.name);
    if (target) target.dispatchEvent(new MouseEvent("click", { bubbles: true }));
    result.zoomedTo = document.getElementById("icicle").getAttribute("data-zoom");
    result.cellsAfterZoom = document.querySelectorAll("#icicle g.cell").length;
    data.metrics.forEach((m) => { select.value = m.name; select.dispatchEvent(new Event("change"));
                                  result.metrics.push([m.name, document.querySelectorAll("#icicle g.cell").length]); });
    const header = Array.from(document.querySelectorAll("#records th")).find((th) => th.textContent === (data.columns[1] || {}).label);
    if (header) header.dispatchEvent(new MouseEvent("click", { bubbles: true }));
    result.sortedFirst = (document.querySelector("#records tbody td.name") || {}).textContent || null;
    result.rows = document.querySelectorAll("#records tbody tr").length;
    const filter = document.getElementById("filter");
    filter.value = "linear"; filter.dispatchEvent(new Event("input"));
    result.filtered = document.querySelectorAll("#records tbody tr").length;
    const pre = document.createElement("pre"); pre.id = "selftest"; pre.textContent = JSON.stringify(result);
    document.body.appendChild(pre);
  }
})();
