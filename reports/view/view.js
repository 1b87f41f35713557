/* harness view: shows the run data embedded in this page. Nothing is fetched. Every text that comes from a run
   (prompts, responses, model outputs, labels) is set as text (text nodes), never parsed as HTML. Outcomes (right,
   wrong, tie, failed) were computed from the benchmarks' declared metrics when the page was built: shown here,
   never re-derived. */
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("data").textContent);
  const F = {};
  DATA.index_fields.forEach(function (name, i) { F[name] = i; });
  const IDX = DATA.index;
  const BENCH = DATA.benches;
  const RUNS = DATA.runs;
  const TWO = RUNS.length === 2;
  const CHANGES = DATA.changes || [];
  const ROW_H = 46;
  const STATUS = ["right", "wrong", "scored"];

  // ---------- DOM helpers: elements from code, text from data ----------
  function h(tag, props) {
    const el = document.createElement(tag);
    if (props) {
      for (const key of Object.keys(props)) {
        const value = props[key];
        if (value === null || value === undefined || value === false) continue;
        if (key === "class") el.className = value;
        else if (key.slice(0, 2) === "on") el.addEventListener(key.slice(2), value);
        else el.setAttribute(key, String(value));
      }
    }
    const kids = Array.prototype.slice.call(arguments, 2).flat(Infinity);
    for (const kid of kids) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }
  function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); return el; }
  function byId(id) { return document.getElementById(id); }
  function range(n) { return Array.from({ length: n }, function (_, i) { return i; }); }
  function fmt(x, digits) {
    return x === null || x === undefined ? "unscored" : Number(x).toFixed(digits === undefined ? 3 : digits);
  }
  function respName(k) { return "Response " + (k + 1); }
  function letter(p) { return String.fromCharCode(65 + p); }

  // ---------- data access ----------
  const chunks = new Map();
  function detail(i) {
    const c = Math.floor(i / DATA.chunk);
    if (!chunks.has(c)) chunks.set(c, JSON.parse(byId("details-" + c).textContent));
    return chunks.get(c)[i % DATA.chunk];
  }
  const byItem = new Map();  // "run|bench|item" -> record indices
  const cells = new Set();   // "run|evaluator|bench" with records
  for (let i = 0; i < IDX.length; i++) {
    const r = IDX[i];
    const key = r[F.run] + "|" + r[F.bench] + "|" + r[F.item];
    if (!byItem.has(key)) byItem.set(key, []);
    byItem.get(key).push(i);
    cells.add(r[F.run] + "|" + r[F.evaluator] + "|" + r[F.bench]);
  }
  function itemOf(i) {
    const r = IDX[i];
    const fp = RUNS[r[F.run]].data[BENCH[r[F.bench]].name];
    const set = fp ? DATA.items[fp] : null;
    return set ? set[r[F.item]] || null : null;
  }
  function missingWhy(i) {
    const r = IDX[i];
    const why = RUNS[r[F.run]].items_missing[BENCH[r[F.bench]].name];
    return why || "this item is not among the items loaded for the run";
  }
  function evName(run, ev) {
    const e = RUNS[run].evaluators[ev];
    return e.rows.length ? e.rows.join(", ") : e.spec;
  }
  function benchIndex(name) { return BENCH.findIndex(function (b) { return b.name === name; }); }

  // ---------- shared pieces ----------
  function outcomeBadges(r) {
    const out = [];
    const st = r[F.status], flags = r[F.flags];
    if (st === 0) out.push(h("span", { class: "badge b-right" }, "right"));
    else if (st === 1) out.push(h("span", { class: "badge b-wrong" }, "wrong"));
    else out.push(h("span", { class: "badge b-scored" }, r[F.value] === null ? "no value" : fmt(r[F.value])));
    if (flags & 1) out.push(h("span", { class: "badge b-tie" }, "tie"));
    if (flags & 2) out.push(h("span", { class: "badge b-fail" }, "failed"));
    return out;
  }
  function goldBadge(d, k) {
    if (d.kind === "pairwise" && d.gold === k) return h("span", { class: "badge b-gold" }, "preferred");
    if (d.kind === "listwise" && d.gold) return h("span", { class: "badge b-gold" }, "gold rank " + d.gold[k]);
    return null;
  }
  function orderText(groups, unscored) {
    const text = (groups || []).map(function (g) {
      return g.map(function (k) { return "R" + (k + 1); }).join(" = ");
    }).join(" > ");
    const rest = unscored && unscored.length ? " (unscored: " + unscored.map(function (k) { return "R" + (k + 1); }).join(", ") + ")" : "";
    return (text || "none scored") + rest;
  }
  function kv(v) {
    if (v === null || v === undefined) return h("span", { class: "muted" }, "-");
    if (typeof v !== "object") {
      const s = String(v);
      return s.length > 100 || s.indexOf("\n") >= 0 ? h("pre", { class: "text" }, s) : h("span", null, s);
    }
    if (Array.isArray(v)) {
      if (!v.length) return h("span", { class: "muted" }, "(none)");
      const flat = v.every(function (x) { return x === null || typeof x !== "object"; });
      if (flat && v.join(", ").length < 200) {
        return h("span", { class: "mono" }, v.map(function (x) { return x === null ? "null" : String(x); }).join(", "));
      }
      return h("ol", { start: 0 }, v.map(function (x) { return h("li", null, kv(x)); }));
    }
    const keys = Object.keys(v);
    if (!keys.length) return h("span", { class: "muted" }, "(none)");
    return h("dl", { class: "kv" }, keys.map(function (k) { return [h("dt", null, k), h("dd", null, kv(v[k]))]; }));
  }
  function fold(title, body, open) { return h("details", { open: open ? "" : null }, h("summary", null, title), body); }
  function pre(text, role) { return h("pre", { class: "text", "data-role": role || null }, text); }

  // ---------- overview ----------
  function openCell(run, spec, bench) {
    state.run = run;
    state.ev = RUNS[run].evaluators.findIndex(function (e) { return e.spec === spec; });
    state.bench = benchIndex(bench);
    state.wrong = state.failed = state.ties = false;
    state.q = "";
    syncFilters();
    showTab("items");
    applyFilter();
    if (state.list.length) pick(0);
  }
  function resultsTable(n, t) {
    const body = [];
    for (const row of t.rows) {
      const ev = RUNS[n].evaluators.findIndex(function (e) { return e.spec === row.spec; });
      body.push(h("tr", null, h("td", null, row.label), row.cells.map(function (c) {
        const b = benchIndex(c.bench);
        if (ev < 0 || !cells.has(n + "|" + ev + "|" + b)) return h("td", { class: c.best ? "best" : null }, c.text);
        const cls = "cell" + (c.best ? " best" : "") + (c.best_dynamic ? " bestdyn" : "");
        return h("td", null, h("button", {
          type: "button", class: cls, "data-cell": row.label + "|" + c.bench, "data-run": n,
          title: "Open the items of " + row.label + " on " + BENCH[b].display,
          onclick: function () { openCell(n, row.spec, c.bench); },
        }, c.text));
      })));
      body.push(h("tr", { class: "paper" }, h("td", null, "paper" + (row.paper_label ? "" : " (none)")),
        row.paper.map(function (p) { return h("td", null, p); })));
    }
    return h("table", { class: "results", "data-run": n },
      h("thead", null, h("tr", null, h("th", null, t.head), t.columns.map(function (c) { return h("th", null, c); }))),
      h("tbody", null, body));
  }
  function countsTable(t) {
    return h("table", { class: "counts" },
      h("thead", null, h("tr", null, h("th", null, t.head), t.columns.map(function (c) { return h("th", null, c); }))),
      h("tbody", null, t.rows.map(function (row) {
        return h("tr", null, h("td", null, row.label), row.counts.map(function (c) { return h("td", null, c); }));
      })));
  }
  function failureTable(failures) {
    if (!failures.length) return h("p", { class: "muted" }, "No record holds a failure.");
    return h("table", { class: "failures-table" },
      h("thead", null, h("tr", null, ["Rows", "Benchmark", "Category", "Failures", "On rerun", "Example"].map(function (c) {
        return h("th", null, c);
      }))),
      h("tbody", null, failures.map(function (f) {
        const b = benchIndex(f.bench);
        return h("tr", null, h("td", null, f.rows.join(", ")), h("td", null, b >= 0 ? BENCH[b].display : f.bench),
          h("td", null, f.category), h("td", { class: "num" }, f.count),
          h("td", null, f.retried ? "retried" : "final (counted)"), h("td", { class: "small" }, f.example));
      })));
  }
  function points(x, signed) {
    if (x === null || x === undefined) return "-";
    const text = (x * 100).toFixed(2);
    return signed && x >= 0 ? "+" + text : text;
  }
  function gateSection(gate) {
    // harness compare's verdicts (computed when the page was built; shown, never re-derived)
    const part = h("div", { id: "gate", "data-exit": gate.exit_code, "data-comparable": gate.differences.length ? "false" : "true" },
      h("h2", null, "Gate"));
    if (gate.differences.length) {
      part.append(h("p", { class: "warn" }, "Not comparable (harness compare exits 2), so no verdict is shown:"),
        h("ul", { class: "notes gate-differences" }, gate.differences.map(function (d) { return h("li", null, d); })));
      return part;
    }
    const level = gate.alpha === null ? "" : Math.round((1 - gate.alpha) * 100) + "% ";
    const count = {};
    gate.cells.forEach(function (c) { count[c.verdict] = (count[c.verdict] || 0) + 1; });
    part.append(h("p", null, "As harness compare says (with its default margins): exit code " + gate.exit_code + "; " + gate.cells.length + " cell(s): " +
      Object.keys(count).map(function (v) { return count[v] + " " + v; }).join(", ") + "."));
    const head = ["Row", "Benchmark", "Metric", "Base", "Candidate", "Diff (points) [" + level + "interval]", "Margin",
      "Detectable (\u00b1 points)", "Items for margin", "Items paired", "Verdict"];
    part.append(h("table", { class: "gate" },
      h("thead", null, h("tr", null, head.map(function (c) { return h("th", null, c); }))),
      h("tbody", null, gate.cells.map(function (c) {
        const b = benchIndex(c.benchmark);
        const m = b >= 0 ? BENCH[b].metrics.find(function (x) { return x.name === c.metric; }) : null;
        function value(x) {
          if (x === null || x === undefined) return "-";
          return m ? (x * m.scale).toFixed(m.digits) : fmt(x);
        }
        const diff = c.diff === null ? "-" : points(c.diff, true) + " [" + points(c.ci_low, true) + ", " + points(c.ci_high, true) + "]";
        return h("tr", { class: "gate-cell", "data-verdict": c.verdict, "data-row": c.row, "data-bench": c.benchmark, "data-metric": c.metric },
          h("td", null, c.row), h("td", null, b >= 0 ? BENCH[b].display : c.benchmark), h("td", null, m ? m.display : c.metric),
          h("td", { class: "num" }, value(c.base)), h("td", { class: "num" }, value(c.candidate)),
          h("td", { class: "num", "data-role": "diff" }, diff), h("td", { class: "num", "data-role": "margin" }, String(c.margin)),
          h("td", { class: "num", "data-role": "half-width" }, c.half_width === null || c.half_width === undefined ? "-" : "\u00b1" + points(c.half_width)),
          h("td", { class: "num", "data-role": "items-needed" }, c.items_needed === null || c.items_needed === undefined ? "-" : String(c.items_needed)),
          h("td", { class: "num" }, c.paired + " / " + c.n_items),
          h("td", null, h("span", { class: "badge verdict verdict-" + c.verdict.replace(/ /g, "-"), "data-verdict": c.verdict }, c.verdict)));
      }))));
    part.append(h("p", { class: "small muted" }, "Points: differences x 100. Regression or improvement: the whole interval lies beyond the margin; " +
      "underpowered: the interval is wider than twice the margin (its half-width, the smallest difference these items could detect, exceeds it), " +
      "and Items for margin is the paired items that would narrow it to the margin; incomplete: a run holds failures a rerun retries; " +
      "unscored: no item scored on both sides. harness compare --config may set other margins."));
    return part;
  }
  function renderOverview() {
    const root = clear(byId("overview"));
    if (TWO && DATA.gate) root.append(gateSection(DATA.gate));
    RUNS.forEach(function (run, n) {
      const ov = run.overview;
      const part = h("div", { class: "run-overview", "data-run": n });
      if (TWO) part.append(h("h2", null, (n === 0 ? "Base run: " : "Candidate run: ") + run.name));
      part.append(h("p", { class: "muted mono" }, run.path));
      part.append(h("h2", null, ov.table.title), resultsTable(n, ov.table));
      part.append(h("p", { class: "small muted" }, "Each value opens its items. Bold: best of our rows; underlined: best dynamic-rubric row; the paper's row under each."));
      part.append(h("h3", null, "Counts"), countsTable(ov.table));
      part.append(h("p", { class: "small" }, ov.table.conventions));
      part.append(h("ul", { class: "notes" }, ov.table.descriptions.concat(ov.notes).map(function (d) { return h("li", null, d); })));
      part.append(h("h3", null, "Failures"), failureTable(ov.failures));
      const missing = Object.keys(run.items_missing);
      if (missing.length) {
        part.append(h("h3", null, "Items not shown"), h("ul", { class: "notes" }, missing.map(function (b) {
          return h("li", null, b + ": " + run.items_missing[b]);
        })));
      }
      part.append(h("h3", null, "Settings and models"));
      for (const pair of ov.settings) part.append(fold(pair[0], kv(pair[1]), pair[0] === "Run"));
      part.append(fold("table.md as rendered", pre(ov.markdown)));
      root.append(part);
    });
    if (TWO) root.append(h("p", null, CHANGES.length + " record(s) changed outcome between the runs: see the Changes tab."));
    root.append(h("p", { class: "small muted" }, "On this page a prompt, response or answer longer than " +
      DATA.limits.text.toLocaleString("en") + " characters, and a raw model output longer than " + DATA.limits.raw.toLocaleString("en") +
      ", is cut with a note; records.jsonl keeps every text whole."));
  }

  // ---------- virtual list ----------
  function VList(el, rowFn, onPick) {
    const space = el.querySelector(".vspace");
    let n = 0, sel = -1, pending = false;
    function draw() {
      pending = false;
      const top = el.scrollTop, height = el.clientHeight || 800;
      const first = Math.max(0, Math.floor(top / ROW_H) - 10);
      const last = Math.min(n, Math.ceil((top + height) / ROW_H) + 10);
      clear(space);
      for (let p = first; p < last; p++) {
        const row = rowFn(p);
        row.classList.add("vrow");
        if (p === sel) row.classList.add("sel");
        row.style.top = (p * ROW_H) + "px";
        row.addEventListener("click", function () { onPick(p); });
        space.append(row);
      }
    }
    el.addEventListener("scroll", function () {
      if (!pending) { pending = true; requestAnimationFrame(draw); }
    });
    return {
      set: function (count) { n = count; sel = -1; space.style.height = (n * ROW_H) + "px"; el.scrollTop = 0; draw(); },
      select: function (p) {
        sel = p;
        const top = p * ROW_H;
        if (top < el.scrollTop || top + ROW_H > el.scrollTop + el.clientHeight) {
          el.scrollTop = Math.max(0, top - el.clientHeight / 2);
        }
        draw();
      },
      draw: draw,
    };
  }

  // ---------- items: filters and list ----------
  const state = { tab: "overview", run: TWO ? 1 : 0, bench: -1, ev: -1, wrong: false, failed: false, ties: false,
    q: "", list: [], pos: -1, change: "", cbench: -1, cq: "", clist: [], cpos: -1 };
  const searchCache = new Map();
  function searchText(i) {
    const r = IDX[i];
    const key = r[F.run] + "|" + r[F.bench] + "|" + r[F.item];
    if (!searchCache.has(key)) {
      const it = itemOf(i);
      const parts = [r[F.item], BENCH[r[F.bench]].display];
      if (it) {
        if (it.messages) it.messages.forEach(function (m) { parts.push(m[1]); });
        else parts.push(it.prompt, it.responses.join("\n"));
        parts.push(JSON.stringify(it.meta));
      }
      searchCache.set(key, parts.join("\n").toLowerCase());
    }
    return searchCache.get(key);
  }
  function applyFilter() {
    const q = state.q.trim().toLowerCase();
    const out = [];
    const names = q ? RUNS[state.run].evaluators.map(function (e) { return (e.rows.join(" ") + " " + e.spec).toLowerCase(); }) : null;
    let total = 0;
    for (let i = 0; i < IDX.length; i++) {
      const r = IDX[i];
      if (r[F.run] !== state.run) continue;
      total++;
      if (state.bench >= 0 && r[F.bench] !== state.bench) continue;
      if (state.ev >= 0 && r[F.evaluator] !== state.ev) continue;
      if (state.wrong && r[F.status] !== 1) continue;
      if (state.failed && !(r[F.flags] & 2)) continue;
      if (state.ties && !(r[F.flags] & 1)) continue;
      if (q && names[r[F.evaluator]].indexOf(q) < 0 && searchText(i).indexOf(q) < 0) continue;
      out.push(i);
    }
    state.list = out;
    state.pos = -1;
    byId("count").textContent = out.length + " of " + total + " records";
    itemList.set(out.length);
  }
  function select(id, label, options, value) {
    return [h("label", { for: id }, label), h("select", { id: id }, options.map(function (o) {
      return h("option", { value: o[0], selected: String(o[0]) === String(value) ? "" : null }, o[1]);
    }))];
  }
  function evOptions() {
    return [[-1, "all"]].concat(RUNS[state.run].evaluators.map(function (e, i) { return [i, e.rows.length ? e.rows.join(", ") : e.spec]; }));
  }
  function buildFilters() {
    const f = clear(byId("filters"));
    if (TWO) f.append.apply(f, select("f-run", "Run", RUNS.map(function (r, i) { return [i, (i ? "candidate: " : "base: ") + r.name]; }), state.run));
    f.append.apply(f, select("f-bench", "Benchmark", [[-1, "all"]].concat(BENCH.map(function (b, i) { return [i, b.display]; })), state.bench));
    f.append.apply(f, select("f-ev", RUNS[state.run].policy ? "Policy" : "Evaluator", evOptions(), state.ev));
    f.append(h("div", { class: "checks" },
      h("label", null, h("input", { type: "checkbox", id: "f-wrong" }), " wrong only"),
      h("label", null, h("input", { type: "checkbox", id: "f-failed" }), " failed only"),
      h("label", null, h("input", { type: "checkbox", id: "f-ties" }), " ties")));
    f.append(h("label", { for: "f-q" }, "Search"), h("input", { type: "search", id: "f-q", placeholder: "item id, prompt, response, row" }));
    f.addEventListener("submit", function (e) { e.preventDefault(); });
    f.addEventListener("change", function (e) {
      if (e.target.id === "f-q") return;
      readFilters(e.target.id === "f-run");
      applyFilter();
    });
    let timer = null;
    byId("f-q").addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () { state.q = byId("f-q").value; applyFilter(); }, 150);
    });
  }
  function readFilters(runChanged) {
    if (TWO) state.run = Number(byId("f-run").value);
    state.bench = Number(byId("f-bench").value);
    state.ev = runChanged ? -1 : Number(byId("f-ev").value);
    state.wrong = byId("f-wrong").checked;
    state.failed = byId("f-failed").checked;
    state.ties = byId("f-ties").checked;
    state.q = byId("f-q").value;
    if (runChanged) syncFilters();
  }
  function syncFilters() {
    if (TWO) byId("f-run").value = String(state.run);
    byId("f-bench").value = String(state.bench);
    const ev = byId("f-ev");
    clear(ev).append.apply(ev, evOptions().map(function (o) { return h("option", { value: o[0] }, o[1]); }));
    ev.value = String(state.ev);
    ev.previousSibling.textContent = RUNS[state.run].policy ? "Policy" : "Evaluator";
    byId("f-wrong").checked = state.wrong;
    byId("f-failed").checked = state.failed;
    byId("f-ties").checked = state.ties;
    byId("f-q").value = state.q;
  }
  function itemRow(p) {
    const i = state.list[p], r = IDX[i];
    return h("div", { "data-index": i, "data-item": r[F.item], "data-repeat": r[F.repeat], "data-status": STATUS[r[F.status]],
      "data-flags": r[F.flags] }, h("div", { class: "line" }, outcomeBadges(r), h("span", { class: "id" }, r[F.item])),
      h("div", { class: "who" }, BENCH[r[F.bench]].display + " \u00b7 " + evName(r[F.run], r[F.evaluator]) + " \u00b7 repeat " + r[F.repeat]));
  }
  function pick(p) {
    if (p < 0 || p >= state.list.length) return;
    state.pos = p;
    itemList.select(p);
    renderItem(state.list[p]);
  }
  const itemList = VList(byId("list"), itemRow, pick);

  // ---------- item view ----------
  function policyFacts(meta) {
    const out = [];
    const rest = Object.assign({}, meta);
    if (rest.reference !== undefined) {
      out.push(fold("Reference answer (" + (rest.reference_generator || "reference") + ")", pre(rest.reference)));
      delete rest.reference; delete rest.reference_generator; delete rest.instruction;
    }
    if (rest.baseline_answer !== undefined) {
      out.push(fold("Baseline answer (" + (rest.baseline || "baseline") + ")", pre(rest.baseline_answer)));
      delete rest.baseline_answer;
    }
    if (Array.isArray(rest.checklist)) { out.push(fold("Checklist", kv(rest.checklist), true)); delete rest.checklist; }
    if (Array.isArray(rest.criteria)) { out.push(fold("Criteria", kv(rest.criteria))); delete rest.criteria; }
    for (const key of ["answer", "gold"]) {
      if (rest[key] !== undefined && typeof rest[key] !== "object") {
        out.push(h("p", null, "Gold answer: ", h("b", { "data-role": "gold" }, String(rest[key]))));
        delete rest[key];
      }
    }
    out.push(fold("Item facts", kv(rest)));
    return out;
  }
  function itemSection(i) {
    const it = itemOf(i), d = detail(i);
    const wrap = h("div", { class: "item-body" });
    if (!it) {
      wrap.append(h("p", { class: "warn" }, "Prompt and responses not shown: " + missingWhy(i)));
      if (d.gold_order) wrap.append(h("p", null, "Gold order: ", h("b", null, orderText(d.gold_order, []))));
      return wrap;
    }
    if (it.messages) {
      wrap.append(h("h3", null, "Prompt"));
      for (const m of it.messages) wrap.append(h("h4", null, m[0]), pre(m[1], "prompt"));
      wrap.append.apply(wrap, policyFacts(it.meta));
      return wrap;
    }
    wrap.append(h("h3", null, "Prompt"), pre(it.prompt, "prompt"));
    wrap.append(h("h3", null, "Candidates"), h("p", null, "Gold: ", h("b", { "data-role": "gold" }, orderText(d.gold_order, []))));
    wrap.append(h("div", { class: "responses" }, it.responses.map(function (text, k) {
      return h("div", { class: "card", "data-response": k }, h("h4", null, respName(k), " ", goldBadge(d, k)), pre(text, "response"));
    })));
    if (Object.keys(it.meta).length) wrap.append(fold("Item facts", kv(it.meta)));
    return wrap;
  }
  function failuresList(fails) {
    if (!fails || !fails.length) return null;
    return [h("h4", null, "Failures"), h("ul", { class: "failures" }, fails.map(function (f) {
      const where = (f.stage || "?") + (f.response !== null && f.response !== undefined ? ", response " + (f.response + 1) : "") +
        (f.item !== null && f.item !== undefined ? ", rubric item " + (f.item + 1) : "");
      return h("li", null, where + ": " + f.category + " after " + f.attempts + " attempt(s): " + f.message);
    }))];
  }
  function metricLine(r, d) {
    const bench = BENCH[r[F.bench]];
    const parts = bench.metrics.filter(function (m) { return d.values[m.name] !== undefined; }).map(function (m) {
      return m.display + " " + (d.values[m.name] === null ? "-" : (m.binary ? String(d.values[m.name]) : fmt(d.values[m.name])));
    });
    const counted = bench.metrics.find(function (m) { return m.name === d.metric; });
    return h("span", { class: "muted small", title: counted ? counted.display + ": " + counted.description : "" }, parts.join(" \u00b7 "));
  }
  function verdictCell(v, m, k, why) {
    if (v === null || v === undefined) {
      const reason = why(m, k);
      return h("td", { class: "v v-failed", "data-m": m, "data-k": k, "data-verdict": "failed", title: reason },
        "failed: " + reason.split(":")[0], h("div", { class: "why" }, reason.length > 90 ? reason.slice(0, 90) + "\u2026" : reason));
    }
    if (v === 1) return h("td", { class: "v v-yes", "data-m": m, "data-k": k, "data-verdict": "yes" }, "yes");
    if (v === 0) return h("td", { class: "v v-no", "data-m": m, "data-k": k, "data-verdict": "no" }, "no");
    return h("td", { class: "v v-soft", "data-m": m, "data-k": k, "data-verdict": "soft" }, "P(yes) " + fmt(v, 2));
  }
  function rubricView(j, d, t) {
    const raw = t.raw || {};
    if (!t.rubric) return h("p", { class: "warn" }, "No rubric: the generator's output could not be read (failures and raw texts below).");
    const k = d.scores.length, V = t.verdicts || [], fails = t.failures || [];
    function why(m, x) {
      const f = fails.find(function (f) { return f.stage === "verify" && f.response === x && (f.item === m || f.item === null); });
      return f ? f.category + ": " + f.message : "no verdict";
    }
    const head = h("tr", null, h("th", null, "#"), h("th", null, "Criterion"), h("th", { class: "num" }, "Weight"),
      range(k).map(function (x) { return h("th", null, respName(x), " ", goldBadge(d, x)); }), h("th", { class: "num" }, "Pass rate"));
    const rows = t.rubric.map(function (item, m) {
      return h("tr", { "data-m": m }, h("td", { class: "num" }, m + 1), h("td", null, item.criterion), h("td", { class: "num" }, item.weight),
        range(k).map(function (x) { return verdictCell(V[m] ? V[m][x] : null, m, x, why); }),
        h("td", { class: "num" }, t.pass_rates && t.pass_rates[m] !== null && t.pass_rates[m] !== undefined ? fmt(t.pass_rates[m], 2) : "-"));
    });
    const foot = h("tr", null, h("td", { colspan: 3 }, "Score: weighted share of yeses"),
      d.scores.map(function (s, x) { return h("td", { class: "num", "data-score": x }, fmt(s)); }), h("td", null, ""));
    const notes = [];
    if (raw.rubric_merged) notes.push(raw.rubric_merged + (raw.rubric_merged === 1 ? " repeated criterion" : " repeated criteria") + " merged into the first occurrence");
    if (t.order) notes.push("the generator saw " + t.order.map(function (x, p) { return letter(p) + " = " + respName(x); }).join(", "));
    if (t.saturated_share !== null && t.saturated_share !== undefined) notes.push("saturated items: " + fmt(t.saturated_share * 100, 0) + "%");
    return [h("h4", null, "Rubric and verdicts"), h("table", { class: "matrix", "data-record": j },
      h("thead", null, head), h("tbody", null, rows), h("tfoot", null, foot)),
      notes.length ? h("p", { class: "muted small" }, notes.join("; ")) : null];
  }
  function gamesView(raw) {
    return [h("h4", null, "Games (both orders)"), h("table", { class: "games" },
      h("thead", null, h("tr", null, ["Game", "Shown as A", "Shown as B", "Verdict", "Winner", "Asks", "Failure"].map(function (c) { return h("th", null, c); }))),
      h("tbody", null, raw.games.map(function (g, n) {
        return h("tr", { "data-game": n }, h("td", null, n + 1), h("td", null, respName(g.a)), h("td", null, respName(g.b)),
          h("td", null, g.verdict === null ? "-" : g.verdict), h("td", null, g.winner === null || g.winner === undefined ? "tie or none" : respName(g.winner)),
          h("td", { class: "num" }, g.asks), h("td", { class: "small" }, g.failure ? g.failure.category + ": " + g.failure.message : ""));
      }))),
    fold("The judge's texts", raw.games.map(function (g, n) {
      return [h("h4", null, "Game " + (n + 1) + ": " + respName(g.a) + " as A, " + respName(g.b) + " as B"), (g.texts || []).map(function (x) { return pre(x); })];
    }))];
  }
  function rawView(raw) {
    const out = [];
    const rest = Object.assign({}, raw);
    if (rest.generator !== undefined) { out.push(h("h4", null, "Generator"), rest.generator === null ? h("p", { class: "muted" }, "(no text)") : pre(rest.generator, "generator")); delete rest.generator; }
    if (rest.generator_problem) { out.push(h("p", { class: "warn" }, "Re-asked: " + rest.generator_problem)); delete rest.generator_problem; }
    if (rest.generator_retry !== undefined) { out.push(h("h4", null, "Generator, re-asked"), pre(rest.generator_retry || "(no text)")); delete rest.generator_retry; }
    const ver = rest.verifier;
    if (ver && Array.isArray(ver.answers)) {
      out.push(h("h4", null, "Verifier answers"));
      const per = ver.answers.length && Array.isArray(ver.answers[0]);
      if (per) out.push(h("table", null, h("tbody", null, ver.answers.map(function (row, m) {
        return h("tr", null, h("th", null, "item " + (m + 1)), row.map(function (x) { return h("td", { class: "mono small" }, x === null ? "-" : x); }));
      }))));
      else ver.answers.forEach(function (x, k) { out.push(h("p", { class: "small" }, respName(k)), pre(x === null ? "(no text)" : x)); });
      if (ver.retries && ver.retries.length) out.push(fold("Re-asks (" + ver.retries.length + ")", kv(ver.retries)));
      delete rest.verifier;
    }
    delete rest.games;
    if (Object.keys(rest).length) out.push(kv(rest));
    return out;
  }
  function evaluatorBody(j, r, d) {
    const t = d.trace || {}, raw = t.raw || {};
    const out = [h("table", { class: "scores" },
      h("tr", null, h("th", null, ""), d.scores.map(function (_, x) { return h("th", null, respName(x), " ", goldBadge(d, x)); })),
      h("tr", null, h("th", null, "Score"), d.scores.map(function (s, x) { return h("td", { class: "num", "data-score": x }, fmt(s)); }))),
    h("p", { class: "order" }, "Predicted order: ", h("b", { "data-role": "predicted" }, orderText(d.order.groups, d.order.unscored)),
      " \u00b7 gold: ", h("b", null, orderText(d.gold_order, [])))];
    const rubricKind = t.rubric || (t.failures || []).some(function (f) { return f.stage === "generate_rubric"; });
    if (rubricKind) out.push(rubricView(j, d, t));
    else if (raw.games) out.push(gamesView(raw));
    else if (t.order) out.push(h("p", { class: "muted small" }, "other candidates shown in the order " + t.order.map(respName).join(", ")));
    if (Object.keys(raw).length) out.push(fold(rubricKind ? "Raw generator and verifier texts" : "Raw outputs", rawView(raw)));
    return out;
  }
  const JUDGMENTS = {
    alpaca_eval2: function (j) {
      return [h("p", null, "Preference ", h("b", { "data-role": "verdict" }, fmt(j.preference)), " (1: the reference is better, 2: the policy's answer)"),
        h("p", { class: "muted small" }, "policy's answer shown " + (j.policy_first ? "first" : "second") + "; read from " + j.mode)];
    },
    arena_hard_v2: function (j, d) {
      const games = j.games || [];
      return h("table", { class: "games" }, h("thead", null, h("tr", null, ["Game", "Shown as A", "Shown as B", "Verdict", "Policy's points", "Failure"].map(function (c) { return h("th", null, c); }))),
        h("tbody", null, games.map(function (g, n) {
          const f = (j.failures || [])[n];
          return h("tr", { "data-game": n }, h("td", null, n + 1), h("td", null, g.model_as_a ? "policy" : "baseline"),
            h("td", null, g.model_as_a ? "baseline" : "policy"), h("td", { "data-role": "verdict" }, g.verdict === null ? "-" : "[[" + g.verdict + "]]"),
            h("td", { class: "num" }, fmt(d.scores[n], 2)), h("td", { class: "small" }, f ? f.category + ": " + f.message : ""));
        })));
    },
    wildbench: function (j) { return h("p", null, "Score ", h("b", { "data-role": "verdict" }, j.score === null ? "none" : String(j.score)), " of 10"); },
    writingbench: function (j) {
      const names = Object.keys(j.scores || {}).concat(Object.keys(j.failures || {}).filter(function (k) { return !(k in (j.scores || {})); }));
      return h("table", null, h("thead", null, h("tr", null, ["Criterion", "Score", "Reason"].map(function (c) { return h("th", null, c); }))),
        h("tbody", null, names.map(function (n) {
          const f = (j.failures || {})[n];
          const score = (j.scores || {})[n];
          return h("tr", null, h("td", null, n), h("td", { class: "num" }, score === null || score === undefined ? "failed" : String(score)),
            h("td", { class: "small" }, f ? f.category + ": " + f.message : (j.reasons || {})[n] || ""));
        })));
    },
    math500: function (j) { return checked(j.answer_parsed, j.gold_parsed, j.verified === null ? "check timed out" : null); },
    mmlu_pro: function (j) { return checked(j.letter, j.gold, j.unextracted ? "no letter extracted" + (j.guessed ? "; guessed" : "") : null); },
    codescope: function (j) { return checked(j.label, j.gold, j.unextracted ? "no label extracted" : null); },
  };
  function checked(answer, gold, note) {
    return [h("table", { class: "checked" }, h("tr", null, h("th", null, "Extracted answer"), h("td", { "data-role": "extracted" }, answer === null || answer === undefined ? "none" : String(answer))),
      h("tr", null, h("th", null, "Gold answer"), h("td", { "data-role": "gold" }, gold === null || gold === undefined ? "-" : String(gold)))),
    note ? h("p", { class: "warn" }, note) : null];
  }
  function policyBody(r, d) {
    const a = d.answer || {}, t = Object.assign({}, d.trace || {});
    const bench = BENCH[r[F.bench]].name;
    const out = [h("h4", null, a.judged !== undefined ? "Answer, as the judge saw it" : "Answer")];
    if (a.raw === null || a.raw === undefined) out.push(h("p", { class: "warn" }, "No answer: the policy's call failed (a rerun retries it)."));
    else {
      out.push(pre(a.judged !== undefined ? a.judged : a.raw, "answer"));
      if (a.judged !== undefined) out.push(fold("The whole answer, with its reasoning (" + a.raw.length + " characters)", pre(a.raw, "raw-answer")));
    }
    const j = t.judgment;
    delete t.judgment; delete t.failures;
    out.push(h("h4", null, "Judgment"));
    if (j === undefined || j === null) out.push(h("p", { class: "muted" }, "No judgment."));
    else {
      out.push(JUDGMENTS[bench] ? JUDGMENTS[bench](j, d) : kv(j));
      out.push(fold("The judgment as recorded (raw answers, re-asks)", kv(j)));
    }
    if (Object.keys(t).length) out.push(fold("Other trace fields", kv(t)));
    return out;
  }
  function recordBlock(j, selected) {
    const r = IDX[j], d = detail(j), st = STATUS[r[F.status]];
    const box = h("section", { class: "record s-" + st + (selected ? " sel" : ""), "data-record": j, "data-status": st });
    box.append(h("div", { class: "head" }, h("strong", null, evName(r[F.run], r[F.evaluator])),
      h("span", { class: "muted" }, "repeat " + r[F.repeat] + " \u00b7 seed " + d.seed), outcomeBadges(r), metricLine(r, d)));
    box.append(h("div", { class: "muted small mono" }, RUNS[r[F.run]].evaluators[r[F.evaluator]].spec));
    box.append.apply(box, [].concat(d.kind === "policy" ? policyBody(r, d) : evaluatorBody(j, r, d)).flat(Infinity).filter(Boolean));
    const fails = failuresList((d.trace || {}).failures);
    if (fails) box.append.apply(box, fails);
    return box;
  }
  function renderItem(i) {
    const r = IDX[i], root = clear(byId("item"));
    root.append(h("div", { class: "nav" },
      h("button", { type: "button", onclick: function () { step(-1); } }, "\u2191 previous (k)"),
      h("button", { type: "button", onclick: function () { step(1); } }, "next (j) \u2193"),
      h("span", { class: "muted" }, (state.pos + 1) + " of " + state.list.length)));
    root.append(h("h2", null, BENCH[r[F.bench]].display + " \u00b7 " + r[F.item]), itemSection(i));
    let recs = byItem.get(r[F.run] + "|" + r[F.bench] + "|" + r[F.item]) || [i];
    if (state.ev >= 0) recs = recs.filter(function (j) { return IDX[j][F.evaluator] === state.ev; });
    recs = recs.slice().sort(function (a, b) { return IDX[a][F.evaluator] - IDX[b][F.evaluator] || IDX[a][F.repeat] - IDX[b][F.repeat]; });
    root.append(h("h3", null, (RUNS[r[F.run]].policy ? "Answers and judgments" : "Evaluations") + " (" + recs.length + ")"));
    let chosen = null;
    for (const j of recs) {
      const block = recordBlock(j, j === i);
      if (j === i) chosen = block;
      root.append(block);
    }
    root.scrollTop = 0;
    if (chosen && recs[0] !== i) chosen.scrollIntoView({ block: "start" });
  }

  // ---------- two runs: changed records ----------
  function buildChangeFilters() {
    const f = clear(byId("change-filters"));
    const kinds = Array.from(new Set(CHANGES.map(function (c) { return c.change; })));
    f.append.apply(f, select("c-kind", "Change", [["", "all"]].concat(kinds.map(function (k) { return [k, k]; })), ""));
    f.append.apply(f, select("c-bench", "Benchmark", [[-1, "all"]].concat(BENCH.map(function (b, i) { return [i, b.display]; })), -1));
    f.append(h("label", { for: "c-q" }, "Search"), h("input", { type: "search", id: "c-q", placeholder: "item id, row" }));
    f.addEventListener("submit", function (e) { e.preventDefault(); });
    f.addEventListener("input", function () {
      state.change = byId("c-kind").value;
      state.cbench = Number(byId("c-bench").value);
      state.cq = byId("c-q").value.trim().toLowerCase();
      applyChangeFilter();
    });
  }
  function applyChangeFilter() {
    const out = [];
    CHANGES.forEach(function (c, n) {
      if (state.change && c.change !== state.change) return;
      if (state.cbench >= 0 && BENCH[state.cbench].name !== c.bench) return;
      if (state.cq && (c.item + " " + c.rows.join(" ")).toLowerCase().indexOf(state.cq) < 0) return;
      out.push(n);
    });
    state.clist = out;
    state.cpos = -1;
    const counts = {};
    CHANGES.forEach(function (c) { counts[c.change] = (counts[c.change] || 0) + 1; });
    byId("change-count").textContent = out.length + " of " + CHANGES.length + " changed records (" +
      Object.keys(counts).map(function (k) { return k + ": " + counts[k]; }).join(", ") + ")";
    changeList.set(out.length);
  }
  function changeRow(p) {
    const c = CHANGES[state.clist[p]];
    const bad = c.change === "right to wrong" || c.change === "worse";
    return h("div", { "data-change": c.change, "data-item": c.item, "data-repeat": c.repeat },
      h("div", { class: "line" }, h("span", { class: "badge " + (bad ? "b-wrong" : "b-right") }, c.change),
        h("span", { class: "id" }, c.item)),
      h("div", { class: "who" }, BENCH[benchIndex(c.bench)].display + " \u00b7 " + c.rows.join(", ") + " \u00b7 repeat " + c.repeat));
  }
  function pickChange(p) {
    if (p < 0 || p >= state.clist.length) return;
    state.cpos = p;
    changeList.select(p);
    const c = CHANGES[state.clist[p]], root = clear(byId("change"));
    root.append(h("div", { class: "nav" },
      h("button", { type: "button", onclick: function () { step(-1); } }, "\u2191 previous (k)"),
      h("button", { type: "button", onclick: function () { step(1); } }, "next (j) \u2193"),
      h("span", { class: "muted" }, (p + 1) + " of " + state.clist.length)));
    root.append(h("h2", null, BENCH[benchIndex(c.bench)].display + " \u00b7 " + c.item + " \u00b7 repeat " + c.repeat + ": " + c.change));
    root.append(h("div", { class: "sidebyside" },
      h("div", { "data-side": "base" }, h("h3", null, "Base: " + RUNS[0].name), recordBlock(c.base, false)),
      h("div", { "data-side": "cand" }, h("h3", null, "Candidate: " + RUNS[1].name), recordBlock(c.cand, false))));
    root.append(h("h3", null, "The item"), itemSection(c.cand));
    root.scrollTop = 0;
  }
  const changeList = VList(byId("change-list"), changeRow, pickChange);

  // ---------- tabs and keys ----------
  function showTab(name) {
    state.tab = name;
    for (const tab of ["overview", "items", "changes"]) {
      byId(tab).hidden = tab !== name;
      const button = byId("tab-" + tab);
      if (button) button.setAttribute("aria-selected", tab === name ? "true" : "false");
    }
    if (name === "items") itemList.draw();
    if (name === "changes") changeList.draw();
  }
  function step(dir) {
    if (state.tab === "items") pick(Math.min(state.list.length - 1, Math.max(0, state.pos + dir)));
    else if (state.tab === "changes") pickChange(Math.min(state.clist.length - 1, Math.max(0, state.cpos + dir)));
  }
  function buildTabs() {
    const nav = byId("tabs");
    const tabs = [["overview", "Overview"], ["items", "Items"]];
    if (TWO) tabs.push(["changes", "Changes (" + CHANGES.length + ")"]);
    for (const t of tabs) {
      nav.append(h("button", { type: "button", id: "tab-" + t[0], role: "tab", "aria-selected": t[0] === "overview" ? "true" : "false",
        onclick: function () { showTab(t[0]); } }, t[1]));
    }
  }
  document.addEventListener("keydown", function (e) {
    const tag = (e.target.tagName || "").toLowerCase();
    if (tag === "input" || tag === "select" || tag === "textarea") {
      if (e.key === "Escape") e.target.blur();
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey || state.tab === "overview") return;
    if (e.key === "j" || e.key === "ArrowDown") { step(1); e.preventDefault(); }
    else if (e.key === "k" || e.key === "ArrowUp") { step(-1); e.preventDefault(); }
    else if (e.key === "/") { byId(state.tab === "items" ? "f-q" : "c-q").focus(); e.preventDefault(); }
  });

  buildTabs();
  renderOverview();
  buildFilters();
  applyFilter();
  if (TWO) { buildChangeFilters(); applyChangeFilter(); }
  window.harnessView = { ready: performance.now(), state: state, records: IDX.length };
  document.body.setAttribute("data-ready", "1");
})();
