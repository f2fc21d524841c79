// The gridbot console: one page, routed by the URL's #fragment, that polls the server's JSON API with the
// user's key (kept in this tab's sessionStorage) and redraws in place. No framework, no build step.
"use strict";

const KEY = "gridbot-key";
const POLL_MS = 2000;
const PAGE = 25;  // jobs per page of a bag's jobs table
const state = {page: null, timer: null, busy: false, auth: true, bag: null, jobs: {after: [0], state: ""},
  hosts: {q: "", sort: "host_id", desc: false, page: 0, size: 50}, job: null};

// -- small helpers ------------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else if (k === "dataset") Object.assign(e.dataset, v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) if (c !== undefined && c !== null) e.append(c instanceof Node ? c : String(c));
  return e;
}

// replaceChildren() writes null as the text "null": leave out what a condition did not make
function fill(e, ...children) {
  e.replaceChildren(...children.flat().filter(c => c !== null && c !== undefined && c !== ""));
}

function secs(edge) {
  return edge < 1 ? `${Number(edge.toPrecision(2))}s` : dur(edge);
}

const int = n => (n === null || n === undefined) ? "" : Number(n).toLocaleString("en-US");
const pct = x => (100 * x).toFixed(x < 0.1 ? 1 : 0) + "%";
const money = x => (x === null || x === undefined) ? "" : Number(x).toFixed(2);
// a tail's cost per task is often a fraction of a cent: three significant digits, not two decimals
const perTask = x => (x === null || x === undefined) ? "" : Math.abs(x) >= 1 ? money(x) : Number(x).toPrecision(3);
const within = (range, f, share) => range ?
  ` (${Math.floor(share * 1000) / 10}% of simulated tails: ${f(range[0])} to ${f(range[1])})` : "";

function dur(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "–";
  if (s < 10) return `${Math.max(0, s).toFixed(1)}s`;
  s = Math.round(s);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor(s % 3600 / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d${Math.floor(s % 86400 / 3600)}h`;
}

const when = t => t ? new Date(t * 1000).toLocaleString() : "";
const enc = encodeURIComponent;

// -- the API, with the key ----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body, type) {
  const headers = {Accept: "application/json"};
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = type || "application/json";
  const resp = await fetch(path, {method, headers, body, cache: "no-store", credentials: "omit"});
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = {error: text.slice(0, 300)}; }
  if (resp.status === 401) {
    showLogin(key ? "The key was refused (revoked, or mistyped): paste it again." : "");
    throw new ApiError(401, (data && data.error) || "a key is needed");
  }
  if (!resp.ok) throw new ApiError(resp.status, (data && data.error) || `HTTP ${resp.status}`);
  return data;
}

function showLogin(message) {
  stopPolling();
  document.getElementById("login").hidden = false;
  document.getElementById("main").hidden = true;
  document.getElementById("login-error").textContent = message || "";
  document.getElementById("key-input").focus();
}

function hideLogin() {
  document.getElementById("login").hidden = true;
  document.getElementById("main").hidden = false;
  document.getElementById("logout").hidden = !sessionStorage.getItem(KEY);
}

async function login(ev) {
  ev.preventDefault();
  const key = document.getElementById("key-input").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY, key);
  document.getElementById("key-input").value = "";
  try {
    await api("GET", "/v1/console/bags");
  } catch (e) {
    if (e.status !== 401) document.getElementById("login-error").textContent = e.message;
    return;
  }
  hideLogin();
  route();
}

// -- routing and polling ------------------------------------------------------------------------------

function stopPolling() {
  if (state.timer) clearTimeout(state.timer);
  state.timer = null;
}

const loggedIn = () => document.getElementById("login").hidden;

function schedule() {
  stopPolling();
  if (!loggedIn()) return;  // the login form is up: nothing to poll until a key is given
  state.timer = setTimeout(async () => {
    if (!document.hidden && state.page && !state.busy) await refresh();
    schedule();
  }, POLL_MS);
}

async function refresh() {
  state.busy = true;
  try {
    await state.page.refresh();
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
  } catch (e) {
    if (e.status !== 401) setStatus(`error: ${e.message}`, true);
  } finally {
    state.busy = false;
  }
}

function setStatus(text, bad) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.classList.toggle("error", !!bad);
}

function route() {
  const hash = location.hash || "#/bags";
  const m = hash.match(/^#key=(.+)$/);
  if (m) {  // `gridbot run --console` hands the run's key in the fragment (never sent to the server)
    sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", "#/bags");
    return route();
  }
  const [, name, arg] = hash.match(/^#\/([a-z]+)\/?(.*)$/) || [null, "bags", ""];
  const pages = {bags: BagsPage, bag: BagPage, pools: PoolsPage, hosts: HostsPage};
  const Page = pages[name] || BagsPage;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === name);
  stopPolling();
  const main = document.getElementById("main");
  fill(main);
  state.page = new Page(main, decodeURIComponent(arg || ""));
  document.title = `gridbot · ${state.page.title}`;
  refresh().then(schedule);
}

// -- bags ---------------------------------------------------------------------------------------------

function progress(info) {
  const c = info.counts, t = Math.max(1, info.total);
  const bar = h("div", {class: "bar", title: `${int(c.done)} done, ${int(c.failed)} failed, ${int(c.running)} running`});
  for (const [k, v] of [["done", c.done], ["failed", c.failed], ["running", c.running]]) {
    const seg = h("span", {class: k});
    seg.style.width = `${(100 * v / t).toFixed(2)}%`;
    bar.append(seg);
  }
  return bar;
}

async function act(button, fn) {
  button.disabled = true;
  try {
    await fn();
    await refresh();
  } catch (e) {
    alertBox(e.message);
  } finally {
    button.disabled = false;
  }
}

function alertBox(message, ok) {
  let box = document.getElementById("message");
  if (!box) {
    box = h("p", {id: "message", role: "alert"});
    document.getElementById("main").prepend(box);
  }
  box.className = ok ? "ok" : "error";
  box.textContent = message;
}

function actions(info) {
  const name = info.name, out = h("span", {class: "actions"});
  if (info.state === "active") {
    out.append(h("button", {type: "button", class: "cancel", onclick: ev => {
      if (confirm(`Cancel bag ${name}? Its running instances are killed.`)) {
        act(ev.target, () => api("POST", `/v1/bags/${enc(name)}/cancel`));
      }
    }}, "Cancel"));
  }
  if (info.counts.failed > 0 && info.state !== "cancelled") {
    // RetryRequest with every field left out: an empty msgpack map (0x80), as `gridbot retry` sends
    out.append(h("button", {type: "button", class: "retry", onclick: ev => act(ev.target, async () => {
      const r = await api("POST", `/v1/bags/${enc(name)}/retry`, new Uint8Array([0x80]), "application/msgpack");
      alertBox(`${int(r.requeued)} failed job(s) of ${name} queued again`, true);
    })}, "Retry failed"));
  }
  return out;
}

class BagsPage {
  constructor(root) {
    this.title = "bags";
    this.table = h("table", {id: "bags"}, h("thead", {}, h("tr", {},
      ["Bag", "State", "Progress", "Done", "Failed", "Running", "Queued", "Total", "Rate", "ETA", "Replicas",
        "Waste", "Spent / budget", ""].map(t => h("th", {}, t)))), h("tbody"));
    root.append(h("h1", {}, "Bags"), h("div", {class: "scroll"}, this.table),
      h("p", {class: "hint"}, "A bag's page has its plots, jobs, policies and story. Diagnostics say why a bag is not moving."));
  }

  async refresh() {
    const bags = await api("GET", "/v1/console/bags");
    const body = this.table.tBodies[0];
    fill(body);
    if (!bags.length) body.append(h("tr", {}, h("td", {colspan: 14, class: "empty"}, "No bags yet: `gridbot submit SPEC`.")));
    for (const s of bags.slice().reverse()) {
      const i = s.info, c = i.counts;
      body.append(h("tr", {dataset: {bag: i.name}},
        h("td", {class: "name"}, h("a", {href: `#/bag/${enc(i.name)}`}, i.name),
          i.description ? h("div", {class: "sub"}, i.description) : null),
        h("td", {class: `state ${i.state}`}, i.state),
        h("td", {}, progress(i)),
        h("td", {class: "c-done num"}, int(c.done)), h("td", {class: "c-failed num"}, int(c.failed)),
        h("td", {class: "c-running num"}, int(c.running)), h("td", {class: "c-queued num"}, int(c.queued)),
        h("td", {class: "c-total num"}, int(i.total)),
        h("td", {class: "c-rate num"}, s.rate ? `${s.rate.toFixed(s.rate < 10 ? 2 : 0)}/s` : ""),
        h("td", {class: "c-eta"}, i.state === "active" ? dur(s.eta) : dur((i.finished_at || 0) - i.created_at)),
        h("td", {class: "c-replicas num"}, int(c.replicas)),
        h("td", {class: "c-waste num"}, pct(s.waste)),
        h("td", {class: "c-spent num"}, i.spent || i.budget !== null ? `${money(i.spent)}${i.budget !== null ? " / " + money(i.budget) : ""}` : ""),
        h("td", {}, actions(i))));
      if (i.diagnostics.length) {
        body.append(h("tr", {class: "diagnostics", dataset: {bagDiagnostics: i.name}},
          h("td", {colspan: 14}, h("ul", {}, i.diagnostics.map(d => h("li", {}, d))))));
      }
    }
  }
}

// -- one bag ------------------------------------------------------------------------------------------

class BagPage {
  constructor(root, name) {
    this.name = name;
    this.title = name;
    this.policyLoaded = false;
    const plots = ["incomplete", "pools", "runtime"].map(id => {
      const s = document.createElementNS("http://www.w3.org/2000/svg", "svg");
      s.id = `plot-${id}`;
      return s;
    });
    [this.incomplete, this.pools, this.runtime] = plots;
    this.frontier = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    this.frontier.id = "plot-frontier";
    this.head = h("div", {id: "bag-head"});
    this.counts = h("dl", {id: "bag-counts", class: "counts"});
    this.tail = h("div", {id: "tail"});
    this.strategy = h("div", {id: "strategy"});
    this.jobsTable = h("table", {id: "jobs"}, h("thead", {}, h("tr", {},
      ["Job", "State", "Attempts", "Failures", "Reason", "Command"].map(t => h("th", {}, t)))), h("tbody"));
    this.jobState = h("select", {id: "job-state", onchange: () => { state.jobs = {after: [0], state: this.jobState.value}; this.loadJobs(); }},
      ["", "queued", "running", "done", "failed", "cancelled"].map(s => h("option", {value: s}, s || "every state")));
    this.jobIndex = h("input", {id: "job-index", type: "number", min: 0, placeholder: "job #", class: "short"});
    this.detail = h("div", {id: "job-detail"});
    this.policyName = h("select", {id: "policy-name", onchange: () => this.showPolicy()});
    this.policyText = h("textarea", {id: "policy-text", rows: 3, spellcheck: "false"});
    this.policyMessage = h("p", {id: "policy-message", role: "status"});
    this.policies = {};
    this.budget = h("input", {id: "qos-budget", placeholder: "budget (none: remove)", class: "short"});
    this.deadline = h("input", {id: "qos-deadline", placeholder: "deadline: 2h, ISO time, none", class: "short"});
    this.qosMessage = h("p", {id: "qos-message", role: "status"});
    state.jobs = {after: [0], state: ""};
    root.append(
      h("p", {class: "crumbs"}, h("a", {href: "#/bags"}, "Bags"), " / ", name),
      this.head, this.counts,
      h("div", {class: "cards"},
        h("section", {class: "card"}, h("h2", {}, "Incomplete jobs"), this.incomplete),
        h("section", {class: "card"}, h("h2", {}, "Results returned per pool over time"), this.pools),
        h("section", {class: "card"}, h("h2", {}, "Run time of results"), this.runtime),
        h("section", {class: "card"}, h("h2", {}, "Tail and strategy"), this.tail, this.strategy, this.frontier)),
      h("div", {class: "cards"},
        h("section", {class: "card"}, h("h2", {}, "Policies"),
          h("form", {id: "policy-form", onsubmit: ev => this.setPolicy(ev)},
            h("label", {for: "policy-name"}, "Policy "), this.policyName, this.policyText,
            h("button", {type: "submit", id: "policy-set"}, "Set policy")), this.policyMessage),
        h("section", {class: "card"}, h("h2", {}, "Deadline and budget"),
          h("form", {id: "qos-form", onsubmit: ev => this.setQos(ev)}, this.budget, this.deadline,
            h("button", {type: "submit", id: "qos-set"}, "Change")), this.qosMessage)),
      h("section", {class: "card wide"}, h("h2", {}, "Jobs"),
        h("div", {class: "toolbar"}, h("label", {for: "job-state"}, "State "), this.jobState,
          h("button", {type: "button", id: "jobs-prev", onclick: () => this.page(-1)}, "‹ Prev"),
          h("button", {type: "button", id: "jobs-next", onclick: () => this.page(1)}, "Next ›"),
          h("form", {class: "inline", onsubmit: ev => { ev.preventDefault(); this.showJob(Number(this.jobIndex.value)); }},
            this.jobIndex, h("button", {type: "submit"}, "Story"))),
        h("div", {class: "scroll"}, this.jobsTable), this.detail));
  }

  async refresh() {
    const b = await api("GET", `/v1/console/bags/${enc(this.name)}`);
    this.draw(b);
    if (!this.policyLoaded) {
      this.policyLoaded = true;
      await this.loadPolicies();
    }
    await this.loadJobs();
  }

  draw(b) {
    const s = b.bag, i = s.info, c = i.counts;
    fill(this.head, h("h1", {}, i.name, " ", h("span", {class: `state ${i.state}`}, i.state)),
      i.description ? h("p", {class: "sub"}, i.description) : null, progress(i), actions(i),
      i.diagnostics.length ? h("ul", {class: "diagnostics", id: "bag-diagnostics"}, i.diagnostics.map(d => h("li", {}, d))) : null);
    const fields = [["total", i.total], ["done", c.done], ["failed", c.failed], ["running", c.running],
      ["queued", c.queued], ["cancelled", c.cancelled], ["instances", c.instances], ["replicas", c.replicas],
      ["wasted", c.wasted], ["overdue", c.overdue]];
    fill(this.counts, ...fields.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {dataset: {field: k}}, int(v))]),
      h("dt", {}, "waste"), h("dd", {dataset: {field: "waste"}}, pct(s.waste)),
      h("dt", {}, "rate"), h("dd", {dataset: {field: "rate"}}, `${s.rate.toFixed(2)}/s`),
      h("dt", {}, i.state === "active" ? "ETA" : "took"),
      h("dd", {dataset: {field: i.state === "active" ? "eta" : "took"}},
        i.state === "active" ? dur(s.eta) : dur((i.finished_at || b.now) - i.created_at)),
      h("dt", {}, "revision"), h("dd", {dataset: {field: "revision"}}, String(i.revision)));
    // incomplete jobs: the store's buckets, then the live count now (it moves on every poll); a large bag's
    // first look answers before its counts are ready (`pending`): the next poll has them
    const pts = b.pending ? [] : b.times.map((t, k) => [t, b.incomplete[k]]).filter(p => p[0] <= b.now);
    const live = i.total - c.done - c.failed - (i.state === "cancelled" ? c.cancelled : 0);
    if (!b.pending) pts.push([i.finished_at || b.now, live]);
    const markers = [];
    if (i.tail_plan) markers.push({x: i.tail_plan.tail_start, label: "tail"});
    if (i.deadline_at) markers.push({x: i.deadline_at, label: "deadline"});
    Plot.lines(this.incomplete, [{name: "incomplete", points: pts}], {time: true, yLabel: "jobs", markers,
      title: "Incomplete jobs over time", empty: b.pending ? "computing…" : undefined});
    this.incomplete.dataset.live = String(live);
    const pools = Object.keys(b.done).sort();
    Plot.lines(this.pools, pools.map(p => ({name: p || "(unknown host)",
      points: b.done[p].map((v, k) => [b.times[k + 1], v]).filter(q => q[0] <= b.now)})),
      {time: true, yLabel: `results per ${dur(b.width)}`, title: "Results returned per pool over time"});
    // the bins that hold results, and an empty one on each side for scale
    let first = b.runtime.findIndex(v => v > 0), last = b.runtime.length - 1 - [...b.runtime].reverse().findIndex(v => v > 0);
    if (first >= 0) [first, last] = [Math.max(0, first - 1), Math.min(b.runtime.length - 1, last + 1)];
    const bins = first < 0 ? [] : b.runtime.slice(first, last + 1).map((v, k) => ({
      label: "<" + secs(b.runtime_edges[first + k] ?? Infinity), value: v}));
    if (first >= 0 && last === b.runtime.length - 1) bins[bins.length - 1].label = ">" + secs(b.runtime_edges.at(-1));
    Plot.bars(this.runtime, bins, {yLabel: "results", title: "Run-time distribution"});
    this.drawStrategy(i);
  }

  drawStrategy(i) {
    const t = i.tail_plan, q = i.qos;
    fill(this.tail, t ? h("dl", {class: "counts"},
      h("dt", {}, "strategy"), h("dd", {dataset: {field: "tail-strategy"}}, t.strategy),
      h("dt", {}, "tail from"), h("dd", {}, when(t.tail_start)),
      h("dt", {}, "tail tasks"), h("dd", {}, `${int(t.done)} of ${int(t.tasks)} done`),
      h("dt", {}, "makespan"), h("dd", {}, `${dur(t.predicted_makespan)} predicted` + within(t.makespan_range, dur, t.range_share) +
        (t.actual_makespan !== null ? `, ${dur(t.actual_makespan)} actual` : `, ${dur(t.elapsed)} so far`)),
      h("dt", {}, "cost / task"), h("dd", {}, `${perTask(t.predicted_cost)} predicted` + within(t.cost_range, perTask, t.range_share) +
        (t.actual_cost !== null ? `, ${perTask(t.actual_cost)} actual` : "")))
      : h("p", {class: "sub"}, "No tail detected yet (a tail strategy reports it here when the bag's tail begins)."));
    if (t && t.frontier.length) {
      this.frontier.hidden = false;
      Plot.scatter(this.frontier, t.frontier.map(([name, makespan, cost]) => ({x: makespan, y: cost,
        label: `${name}: ${dur(makespan)}, ${perTask(cost)}/task`, chosen: name === t.strategy})),
        {yLabel: "cost/task", xLabel: "tail makespan (s)", title: "ExPERT's Pareto frontier"});
    } else {
      this.frontier.hidden = true;
    }
    if (q) {
      const max = Math.max(q.budget || 0, q.projected_cost, 1e-9);
      const row = (label, v, cls) => h("div", {class: "meter"}, h("span", {class: "label"}, label),
        (() => { const b = h("span", {class: `fill ${cls}`}); b.style.width = `${Math.min(100, 100 * v / max)}%`; return b; })(),
        h("span", {class: "value"}, money(v)));
      fill(this.strategy, h("p", {}, `Placement ${q.strategy}`),
        row("spent", q.spent, "done"), row("committed", q.committed, "running"),
        row("projected", q.projected_cost, "queued"), q.budget !== null ? row("budget", q.budget, "budget") : "",
        h("p", {class: "sub", id: "qos-finish"}, `projected finish ${q.projected_finish ? when(q.projected_finish) : "unknown"}` +
          (q.deadline_at ? `, deadline ${when(q.deadline_at)}` : "") + (q.unplanned ? `; ${int(q.unplanned)} jobs fit no pool` : "")));
    } else {
      fill(this.strategy, i.budget !== null || i.spent ? h("p", {}, `spent ${money(i.spent)}` +
        (i.budget !== null ? ` of ${money(i.budget)}` : "")) : "");
    }
  }

  async loadPolicies() {
    this.policies = await api("GET", `/v1/bags/${enc(this.name)}/policy`);
    const chosen = this.policyName.value;
    fill(this.policyName, ...Object.keys(this.policies).map(n => h("option", {value: n}, n)));
    if (chosen) this.policyName.value = chosen;
    this.showPolicy();
  }

  showPolicy() {
    this.policyText.value = this.policies[this.policyName.value] || "";
  }

  async setPolicy(ev) {
    ev.preventDefault();
    const name = this.policyName.value, text = this.policyText.value;
    this.policyMessage.className = "";
    try {
      await api("POST", `/v1/bags/${enc(this.name)}/policy`, JSON.stringify({name, text}));
      this.policyMessage.className = "ok";
      this.policyMessage.textContent = `${name} set; the next decision uses it.`;
      await this.loadPolicies();
    } catch (e) {
      this.policyMessage.className = "error";
      this.policyMessage.textContent = e.message;
    }
  }

  async setQos(ev) {
    ev.preventDefault();
    const change = {};
    const b = this.budget.value.trim(), d = this.deadline.value.trim();
    if (b) change.budget = b === "none" ? null : Number(b);
    if (d) change.bag_deadline = d === "none" ? null : d;
    try {
      await api("POST", `/v1/bags/${enc(this.name)}/qos`, JSON.stringify(change));
      this.qosMessage.className = "ok";
      this.qosMessage.textContent = "changed; the placement plans with it from the next decision.";
      await refresh();
    } catch (e) {
      this.qosMessage.className = "error";
      this.qosMessage.textContent = e.message;
    }
  }

  page(step) {
    const a = state.jobs.after;
    if (step < 0 && a.length > 1) a.pop();
    if (step > 0 && this.lastJob !== undefined && this.full) a.push(this.lastJob);
    this.loadJobs();
  }

  async loadJobs() {
    const after = state.jobs.after.at(-1);
    const q = `limit=${PAGE}&after=${after}` + (state.jobs.state ? `&state=${enc(state.jobs.state)}` : "");
    const jobs = await api("GET", `/v1/bags/${enc(this.name)}/jobs?${q}`);
    this.full = jobs.length === PAGE;
    this.lastJob = jobs.length ? jobs[jobs.length - 1].job_id : undefined;
    const body = this.jobsTable.tBodies[0];
    fill(body, ...jobs.map(j => h("tr", {dataset: {job: j.index}, class: "clickable",
      onclick: () => this.showJob(j.index)},
      h("td", {class: "num"}, j.index), h("td", {class: `state ${j.state}`}, j.state), h("td", {class: "num"}, j.attempts),
      h("td", {class: "num"}, j.failures), h("td", {}, j.reason || ""), h("td", {class: "command"}, j.command))));
    if (!jobs.length) body.append(h("tr", {}, h("td", {colspan: 6, class: "empty"}, "no jobs here")));
    document.getElementById("jobs-prev").disabled = state.jobs.after.length <= 1;
    document.getElementById("jobs-next").disabled = !this.full;
    if (state.job !== null && state.job.bag === this.name) await this.showJob(state.job.index, true);
  }

  async showJob(index, quiet) {
    if (!Number.isInteger(index) || index < 0) return;
    state.job = {bag: this.name, index};
    try {
      const [story, logs] = await Promise.all([api("GET", `/v1/bags/${enc(this.name)}/story/${index}`),
        api("GET", `/v1/bags/${enc(this.name)}/logs/${index}`)]);
      // the files the kept result declared (outputs), as the API gives them: the one result of this job
      const results = story.result_instance === null ? [] :
        await api("GET", `/v1/bags/${enc(this.name)}/results?after=${story.job.job_id - 1}&limit=1`);
      const kept = results.find(r => r.job.job_id === story.job.job_id);
      const files = kept ? Object.entries(kept.outputs) : [];
      const events = Object.fromEntries(story.events.map(e => [e.event_id, e]));
      const ev = id => id !== null && events[id] ? `${events[id].kind} #${id}` : "";
      fill(this.detail, 
        h("h3", {}, `Job ${index}: ${story.job.state}`, " ", h("button", {type: "button", onclick: () => {
          state.job = null; fill(this.detail); }}, "close")),
        h("p", {class: "command"}, story.job.command),
        h("div", {class: "scroll"}, h("table", {id: "story"}, h("thead", {}, h("tr", {},
          ["Instance", "Host", "Pool", "State", "Sent", "Ended", "Wall", "Replica", "Sent by", "Ended by", "Reason"]
            .map(t => h("th", {}, t)))),
        h("tbody", {}, story.instances.map(i => h("tr", {class: i.instance_id === story.result_instance ? "kept" : ""},
          h("td", {class: "num"}, i.instance_id), h("td", {}, i.host_name || i.host_id), h("td", {}, i.pool || ""),
          h("td", {class: `state ${i.state}`}, i.state), h("td", {}, when(i.sent_at)), h("td", {}, when(i.ended_at)),
          h("td", {class: "num"}, i.wall_s !== null ? dur(i.wall_s) : ""), h("td", {}, i.replica ? "yes" : ""),
          h("td", {}, ev(i.sent_event)), h("td", {}, ev(i.end_event)), h("td", {}, i.reason || "")))))),
        story.decisions.length ? h("div", {}, h("h4", {}, "Decisions"), h("ul", {}, story.decisions.map(d =>
          h("li", {}, `${d.strategy}: ${d.action} — ${d.why}`)))) : null,
        h("h4", {}, "Output files"),
        files.length ? h("ul", {id: "job-outputs"}, files.map(([name, data]) => h("li", {},
          h("a", {href: `data:application/octet-stream;base64,${data}`, download: name}, name),
          ` (${Math.floor(data.length * 3 / 4 - (data.endsWith("==") ? 2 : data.endsWith("=") ? 1 : 0)).toLocaleString()} bytes)`)))
          : h("p", {id: "job-outputs", class: "hint"}, story.result_instance === null ? "no result yet" : "none declared"),
        h("h4", {}, "Output"),
        ...logs.instances.map(i => h("details", {open: i.kept}, h("summary", {},
          `instance ${i.instance_id} (${i.state}${i.exit_code !== null ? `, exit ${i.exit_code}` : ""})${i.kept ? " — kept" : ""}`),
          h("pre", {class: "stdout"}, i.stdout_tail || "(no output)"), i.stderr_tail ? h("pre", {class: "stderr"}, i.stderr_tail) : null)));
    } catch (e) {
      if (!quiet) fill(this.detail, h("p", {class: "error"}, e.message));
    }
  }
}

// -- pools and pilots ---------------------------------------------------------------------------------

class PoolsPage {
  constructor(root) {
    this.title = "pools";
    this.table = h("table", {id: "pools"}, h("thead", {}, h("tr", {},
      ["Pool", "Kind", "Queued", "Running", "Ended", "Failed", "Submitted", "Hosts", "Jobs done", "Jobs/s", "Limits", "Error"]
        .map(t => h("th", {}, t)))), h("tbody"));
    this.errors = h("ul", {id: "pool-errors", class: "diagnostics"});
    this.pilots = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    this.pilots.id = "plot-pilots";
    this.throughput = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    this.throughput.id = "plot-throughput";
    root.append(h("h1", {}, "Pools and pilots"), h("div", {class: "scroll"}, this.table), this.errors,
      h("div", {class: "cards"},
        h("section", {class: "card"}, h("h2", {}, "Effective throughput (CPU-s of results per s)"), this.throughput),
        h("section", {class: "card"}, h("h2", {}, "Pilots per pool and state"), this.pilots)));
  }

  async refresh() {
    const p = await api("GET", "/v1/console/pools");
    const body = this.table.tBodies[0];
    const names = new Set([...p.pools.map(x => x.name), ...Object.keys(p.hosts), ...Object.keys(p.throughput)]);
    const info = Object.fromEntries(p.pools.map(x => [x.name, x]));
    fill(body, ...[...names].sort().map(n => {
      const x = info[n];
      return h("tr", {dataset: {pool: n}}, h("td", {}, n || "(unknown)"), h("td", {}, x ? x.kind : "workers"),
        h("td", {class: "num"}, x ? int(x.pilots_queued) : ""), h("td", {class: "num"}, x ? int(x.pilots_running) : ""),
        h("td", {class: "num"}, x ? int(x.pilots_ended) : ""), h("td", {class: "num"}, x ? int(x.pilots_failed) : ""),
        h("td", {class: "num"}, x ? int(x.pilots_submitted) : ""), h("td", {class: "hosts num"}, int(p.hosts[n] || 0)),
        h("td", {class: "num"}, x ? int(x.jobs_done) : ""), h("td", {class: "num"}, x ? x.throughput.toFixed(2) : ""),
        h("td", {}, x ? `${x.max_running} running, ${x.max_queued} queued` : ""),
        h("td", {class: "error"}, (x && x.error) || p.errors[n] || ""));
    }));
    fill(this.errors, ...Object.entries(p.errors).map(([n, e]) => h("li", {}, `pool ${n}: ${e}`)));
    const t = p.times;
    Plot.lines(this.throughput, Object.keys(p.throughput).sort().map(n => ({name: n || "(unknown)",
      points: p.throughput[n].map((v, k) => [t[k], v])})), {time: true, yLabel: "CPU-s/s"});
    const series = [];
    for (const n of Object.keys(p.pilots).sort()) {
      for (const s of ["queued", "running"]) series.push({name: `${n} ${s}`, points: p.pilots[n][s].map((v, k) => [t[k], v])});
    }
    Plot.lines(this.pilots, series, {time: true, yLabel: "pilots"});
  }
}

// -- hosts --------------------------------------------------------------------------------------------

class HostsPage {
  constructor(root) {
    this.title = "hosts";
    const cols = [["host_id", "Host"], ["name", "Name"], ["pool", "Pool"], ["ncpus", "CPUs"], ["done", "Done"],
      ["failed", "Failed"], ["error_rate", "Error rate"], ["black_hole", "Black hole"], ["jobs_today", "Jobs today"],
      ["turnaround", "Turnaround"], ["last_seen", "Last seen"]];
    this.table = h("table", {id: "hosts"}, h("thead", {}, h("tr", {}, cols.map(([k, t]) =>
      h("th", {dataset: {sort: k}, class: "sortable", onclick: () => this.sort(k)}, t)))), h("tbody"));
    this.search = h("input", {id: "host-search", type: "search", placeholder: "search id, name or pool",
      value: state.hosts.q, oninput: () => { state.hosts.q = this.search.value; state.hosts.page = 0; refresh(); }});
    this.count = h("span", {id: "host-count"});
    this.pager = h("span", {id: "host-pager"},
      h("button", {type: "button", id: "hosts-prev", onclick: () => this.go(-1)}, "‹ Prev"),
      h("span", {id: "host-page"}),
      h("button", {type: "button", id: "hosts-next", onclick: () => this.go(1)}, "Next ›"));
    root.append(h("h1", {}, "Hosts"), h("div", {class: "toolbar"}, this.search, this.count, this.pager),
      h("div", {class: "scroll"}, this.table));
  }

  sort(key) {
    const s = state.hosts;
    s.desc = s.sort === key ? !s.desc : ["done", "failed", "error_rate", "black_hole", "jobs_today", "last_seen"].includes(key);
    s.sort = key;
    s.page = 0;
    refresh();
  }

  go(step) {
    state.hosts.page = Math.max(0, state.hosts.page + step);
    refresh();
  }

  async refresh() {
    const s = state.hosts;
    const q = `q=${enc(s.q)}&sort=${s.sort}&desc=${s.desc ? 1 : 0}&page=${s.page}&size=${s.size}`;
    const p = await api("GET", `/v1/console/hosts?${q}`);
    for (const th of this.table.tHead.rows[0].cells) {
      th.classList.toggle("asc", th.dataset.sort === s.sort && !s.desc);
      th.classList.toggle("desc", th.dataset.sort === s.sort && s.desc);
    }
    fill(this.table.tBodies[0], ...p.rows.map(r => h("tr", {dataset: {host: r.host_id}, class: r.alive ? "" : "gone"},
      h("td", {class: "mono"}, r.host_id), h("td", {}, r.name), h("td", {}, r.pool), h("td", {class: "num"}, r.ncpus),
      h("td", {class: "c-done num"}, int(r.done)), h("td", {class: "c-failed num"}, int(r.failed)),
      h("td", {class: "num"}, pct(r.error_rate)), h("td", {class: r.black_hole ? "error" : ""}, r.black_hole ? "yes" : ""),
      h("td", {class: "num"}, int(r.jobs_today)), h("td", {class: "num"}, dur(r.turnaround)),
      h("td", {}, `${dur(Date.now() / 1000 - r.last_seen)} ago`))));
    const pages = Math.max(1, Math.ceil(p.matched / p.size));
    this.count.textContent = `${int(p.matched)} of ${int(p.total)} hosts · ${int(p.alive)} alive · ${int(p.black_holes)} black holes`;
    document.getElementById("host-page").textContent = ` page ${p.page + 1} of ${pages} `;
    document.getElementById("hosts-prev").disabled = p.page === 0;
    document.getElementById("hosts-next").disabled = p.page + 1 >= pages;
  }
}

// -- start ----------------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", login);
  document.getElementById("logout").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    showLogin("");
  });
  window.addEventListener("hashchange", route);
  document.addEventListener("visibilitychange", () => { if (!document.hidden && state.page) refresh(); });
  hideLogin();
  route();
});
