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
    data.columns.concat(data.metrics).forEach((c) => {
      if (!lines.some((l) => l[0] === c.label)) lines.push([c.label, node.shown[c.name]]);
    });
    return lines;
  }

  // -- icicle: a row per depth below the zoomed node, widths in proportion to the metric ------------------
  function layout(node, x0, x1, out) {
    out.push({ node: node, x0: x0, x1: x1 });
    const kids = node.children.filter((c) => value(c) > 0);
    const total = Math.max(value(node), kids.reduce((s, c) => s + value(c), 0));
    let x = x0;
    kids.forEach((child) => {
      const w = total > 0 ? (x1 - x0) * value(child) / total : 0;
      if (w > 0.5) layout(child, x, x + w, out);
      x += w;
    });
    return out;
  }
  function drawIcicle() {
    const svg = document.getElementById("icicle");
    clear(svg);
    const width = svg.clientWidth || 1000, rowHeight = 22;
    const cells = state.metric ? layout(state.zoom, 0, width, []) : [];
    const base = state.zoom.depth;
    const depth = cells.reduce((d, c) => Math.max(d, c.node.depth - base), 0);
    svg.setAttribute("viewBox", "0 0 " + width + " " + (depth + 1) * rowHeight);
    svg.setAttribute("height", (depth + 1) * rowHeight);
    svg.setAttribute("data-zoom", state.zoom.name);
    cells.forEach(({ node, x0, x1 }) => {
      const g = el("g", { class: "cell", "data-name": node.name, transform: "translate(" + x0 + "," + (node.depth - base) * rowHeight + ")" }, svg);
      el("rect", { width: Math.max(x1 - x0, 0), height: rowHeight, fill: color(node) }, g);
      const text = el("text", { x: 4, y: 15 }, g);
      const label = node === state.zoom ? fullName(node) : node.label;
      const room = Math.floor((x1 - x0 - 8) / 6.5);
      text.textContent = room >= label.length ? label : (room > 3 ? label.slice(0, room - 1) + "\u2026" : "");
      const title = el("title", {}, g); title.textContent = fullName(node);  // the name, even where the box is narrow
      g.addEventListener("click", () => zoomTo(node === state.zoom && node.parent !== null ? nodes[node.parent] : node));
      g.addEventListener("mousemove", (event) => showTooltip(event, nodeLines(node)));
      g.addEventListener("mouseleave", hideTooltip);
    });
    const crumbs = document.getElementById("crumbs");
    const path = []; for (let n = state.zoom; n; n = n.parent === null ? null : nodes[n.parent]) path.unshift(fullName(n));
    crumbs.textContent = path.join(" \u203A ") + " \u2014 " + (state.zoom.shown[state.metric] || "");
  }
  function zoomTo(node) { state.zoom = node; hideTooltip(); drawIcicle(); }

  // -- timeline: forward and backward lanes, a row per depth ----------------------------------------------
  function drawTimeline() {
    const svg = document.getElementById("timeline");
    clear(svg);
    const slices = data.timeline.slices;
    document.getElementById("timeline-caption").textContent = slices.length
      ? "(step " + data.timeline.step + ", one row per depth)" : "(no calls recorded)";
    if (!slices.length) { svg.setAttribute("height", 0); return; }
    const width = svg.clientWidth || 1000, left = 70, rowHeight = 14;
    const end = slices.reduce((m, s) => Math.max(m, s.start + s.duration), 0) || 1;
    const scale = (width - left - 4) / end;
    let y = 0;
    ["forward", "backward"].forEach((phase) => {
      const lane = slices.filter((s) => s.phase === phase);
      if (!lane.length) return;
      const depths = lane.reduce((m, s) => Math.max(m, s.depth), 0) + 1;
      const label = el("text", { x: 4, y: y + 12, class: "lane-label" }, svg); label.textContent = phase;
      lane.forEach((s) => {
        const g = el("g", { class: "slice" }, svg);
        const x = left + s.start * scale, w = Math.max(s.duration * scale, 0.5);
        el("rect", { x: x, y: y + s.depth * rowHeight, width: w, height: rowHeight - 1,
                     fill: "hsl(" + hue(s.type) + ", 55%, " + (phase === "forward" ? 68 : 58) + "%)" }, g);
        if (w > 40) { const t = el("text", { x: x + 3, y: y + s.depth * rowHeight + 11 }, g); t.textContent = s.name.split(".").pop(); }
        g.addEventListener("mousemove", (event) => showTooltip(event, [[s.name, s.type], [phase, s.shown]]));
        g.addEventListener("mouseleave", hideTooltip);
      });
      y += depths * rowHeight + 8;
    });
    svg.setAttribute("viewBox", "0 0 " + width + " " + y);
    svg.setAttribute("height", y);
  }

  // -- table: click a header to sort, type to filter ------------------------------------------------------
  const columns = [{ name: "name", label: "Name" }, { name: "type", label: "Type" }].concat(data.columns);
  function drawTable() {
    const head = document.querySelector("#records thead"), body = document.querySelector("#records tbody");
    clear(head); clear(body);
    const tr = document.createElement("tr");
    columns.forEach((c) => {
      const th = document.createElement("th");
      th.textContent = c.label; th.className = c.name === "name" || c.name === "type" ? c.name : "";
      if (state.sortBy === c.name) th.classList.add(state.sortDesc ? "sorted-desc" : "sorted-asc");
      th.addEventListener("click", () => { state.sortDesc = state.sortBy === c.name ? !state.sortDesc : c.name !== "name" && c.name !== "type";
                                           state.sortBy = c.name; drawTable(); });
      tr.appendChild(th);
    });
    head.appendChild(tr);
    const needle = state.filter.toLowerCase();
    let rows = nodes.filter((n) => !needle || fullName(n).toLowerCase().includes(needle) || n.type.toLowerCase().includes(needle));
    if (state.sortBy) {
      const key = state.sortBy, sign = state.sortDesc ? -1 : 1;
      const get = (n) => key === "name" ? fullName(n) : key === "type" ? n.type : n.values[key];
      rows = rows.slice().sort((a, b) => {
        const x = get(a), y = get(b);
        if (x === y) return a.index - b.index;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * sign;
      });
    }
    rows.forEach((n) => {
      const row = document.createElement("tr");
      columns.forEach((c) => {
        const td = document.createElement("td");
        td.className = c.name === "name" || c.name === "type" ? c.name : "";
        if (c.name === "name") { td.textContent = fullName(n); td.style.paddingLeft = (8 + 12 * n.depth) + "px"; }
        else td.textContent = c.name === "type" ? n.type : n.shown[c.name];
        row.appendChild(td);
      });
      row.addEventListener("click", () => zoomTo(n));
      body.appendChild(row);
    });
    document.getElementById("count").textContent = rows.length + " of " + nodes.length + " modules";
  }

  // -- wiring ---------------------------------------------------------------------------------------------
  document.getElementById("subtitle").textContent = data.subtitle;
  const select = document.getElementById("metric");
  data.metrics.forEach((m) => { const o = document.createElement("option"); o.value = m.name; o.textContent = m.label; select.appendChild(o); });
  select.addEventListener("change", () => { state.metric = select.value; drawIcicle(); });
  document.getElementById("zoom-out").addEventListener("click", () => zoomTo(root));
  document.getElementById("filter").addEventListener("input", (event) => { state.filter = event.target.value; drawTable(); });
  window.addEventListener("resize", () => { drawIcicle(); drawTimeline(); });
  drawIcicle(); drawTimeline(); drawTable();

  // A check a headless browser can run: open the file with #selftest and read #selftest from the DOM.
  if (location.hash === "#selftest") {
    const result = { names: [], tooltip: null, zoomedTo: null, cellsAfterZoom: 0, metrics: [], rows: 0,
                     sortedFirst: null, filtered: 0 };
    document.querySelectorAll("#icicle g.cell").forEach((g) => result.names.push(g.getAttribute("data-name")));
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
