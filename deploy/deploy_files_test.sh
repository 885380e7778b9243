#!/usr/bin/env bash
# Checks the deployment files in deploy/:
#   - prometheus/prometheus.yml passes `promtool check config`;
#   - grafana/mpilearn-dashboard.json is valid JSON, uses only metric names
#     that docs/observability.md documents (after dropping the _bucket,
#     _count and _sum suffixes of histograms), covers the panels
#     deploy/README.md promises, its panels do not overlap on the grid,
#     and its PromQL parses (`promtool check rules`, with the dashboard's
#     variables filled in); tests/dashboard_test evaluates every query
#     against a real Prometheus scraping a real master;
#   - mpilearn-master.service starts mpilearn-master with a metrics endpoint;
#   - slurm_group.sbatch is valid bash and starts the group with mpirun;
#     slurm_train.sbatch is valid bash (both pass shellcheck where it is
#     installed). tests/slurm_test runs both under a real Slurm.
# promtool and python3 checks are skipped, saying so, where the tool is
# missing.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:?must run under bazel test}/mpilearn"
DEPLOY="$RUNFILES/deploy"
PROM_CONFIG="$DEPLOY/prometheus/prometheus.yml"
DASHBOARD="$DEPLOY/grafana/mpilearn-dashboard.json"
UNIT="$DEPLOY/mpilearn-master.service"
SBATCH="$DEPLOY/slurm_group.sbatch"
TRAIN_SBATCH="$DEPLOY/slurm_train.sbatch"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
skip() { echo "SKIP: $*"; }
ok() { echo "ok: $*"; }

for f in "$PROM_CONFIG" "$DASHBOARD" "$UNIT" "$SBATCH" "$TRAIN_SBATCH"; do
  [[ -f "$f" ]] || { echo "FAIL: missing $f" >&2; exit 1; }
done

# docs/observability.md, the list of metric names (data of the test).
DOC="$RUNFILES/docs/observability.md"
if [[ ! -f "$DOC" ]]; then
  echo "FAIL: cannot find docs/observability.md in the runfiles ($DOC)" >&2
  exit 1
fi
echo "metric names from $DOC"

PROMTOOL="$(command -v promtool || true)"
[[ -z "$PROMTOOL" && -x /usr/bin/promtool ]] && PROMTOOL=/usr/bin/promtool
PYTHON="$(command -v python3 || true)"
[[ -z "$PYTHON" && -x /usr/bin/python3 ]] && PYTHON=/usr/bin/python3

# --- Prometheus ------------------------------------------------------------
if [[ -n "$PROMTOOL" ]]; then
  if out="$("$PROMTOOL" check config "$PROM_CONFIG" 2>&1)"; then
    ok "promtool check config prometheus.yml"
  else
    fail "promtool check config prometheus.yml:"$'\n'"$out"
  fi
else
  skip "promtool not found (Debian: apt-get install prometheus); prometheus.yml not checked by promtool"
fi
grep -Eq '^ *- job_name: *"?mpilearn"?$' "$PROM_CONFIG" || fail "prometheus.yml: no job_name mpilearn"
grep -Eq '"127\.0\.0\.1:7071"' "$PROM_CONFIG" || fail "prometheus.yml: no 127.0.0.1:7071 target"
# The master's job id label is `job_id`, so Prometheus' own `job` label must
# stay Prometheus': honor_labels would let a scraped `job` label override it.
if grep -Eq '^ *honor_labels: *true' "$PROM_CONFIG"; then fail "prometheus.yml: honor_labels: true is not needed"; fi
grep -q 'job=~' "$DASHBOARD" && fail "dashboard: filters on \`job\`; the master's label is job_id"

# --- Grafana dashboard ------------------------------------------------------
if [[ -n "$PYTHON" ]]; then
  rm -f "$TMP/dashboard_rules.yml"
  if out="$("$PYTHON" - "$DASHBOARD" "$DOC" "$TMP/dashboard_rules.yml" <<'PY' 2>&1
import json, re, sys

dashboard_path, doc_path, rules_path = sys.argv[1:4]
problems = []
try:
    with open(dashboard_path) as f:
        dashboard = json.load(f)
except ValueError as e:
    print("not valid JSON: %s" % e)
    sys.exit(1)
with open(doc_path) as f:
    doc = f.read()

if not 30 <= dashboard.get("schemaVersion", 0) <= 40:
    problems.append("schemaVersion %r, want about 36" % dashboard.get("schemaVersion"))

variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
job = variables.get("job")
if job is None:
    problems.append("no `job` template variable")
else:
    query = job.get("query")
    query = query.get("query", "") if isinstance(query, dict) else (query or "")
    if not re.match(r"label_values\(mpilearn_job_info\b.*,\s*job_id\)$", query):
        problems.append("job variable query %r is not label_values(mpilearn_job_info, job_id)" % query)
    if not (job.get("multi") and job.get("includeAll")):
        problems.append("job variable must allow multiple values and All")

# Panels, including those nested in collapsed rows.
def walk(panels):
    for p in panels:
        yield p
        yield from walk(p.get("panels", []))
panels = list(walk(dashboard.get("panels", [])))
ids = [p.get("id") for p in panels]
if len(ids) != len(set(ids)):
    problems.append("panel ids are not unique")

# Panels placed on the 24-column grid without covering one another.
cells = {}
for p in panels:
    g = p.get("gridPos") or {}
    x, y, w, h = (g.get(k, 0) for k in ("x", "y", "w", "h"))
    if w <= 0 or h <= 0 or x < 0 or x + w > 24:
        problems.append("panel %r: gridPos %r is off the 24-column grid" % (p.get("title"), g))
        continue
    for cell in ((cx, cy) for cx in range(x, x + w) for cy in range(y, y + h)):
        if cell in cells:
            problems.append("panels %r and %r overlap" % (cells[cell], p.get("title")))
            break
        cells[cell] = p.get("title")

exprs = []  # PromQL from panels
for p in panels:
    if p.get("type") == "row":
        continue
    ds = json.dumps(p.get("datasource"))
    if "${datasource}" not in ds and "${DS_PROMETHEUS}" not in ds:
        problems.append("panel %r: datasource %s is not the dashboard's variable" % (p.get("title"), ds))
    if not p.get("targets"):
        problems.append("panel %r has no queries" % p.get("title"))
    for t in p.get("targets", []):
        if t.get("expr"):
            exprs.append((p.get("title"), t["expr"]))
var_queries = []  # label_values(SELECTOR, label) of the variables
for v in variables.values():
    if v.get("type") != "query":
        continue
    query = v.get("query")
    query = query.get("query", "") if isinstance(query, dict) else (query or "")
    var_queries.append((v.get("name"), query))

# Every metric name must be documented (histograms and counters by their
# family name: drop _bucket, _count, _sum).
names = set()
for _, text in exprs + var_queries:
    names.update(re.findall(r"mpilearn_[a-z_]+", text))
for name in sorted(names):
    family = re.sub(r"_(bucket|count|sum)$", "", name)
    if not re.search(r"(?<![a-z_])" + re.escape(family) + r"(?![a-z_])", doc):
        problems.append("metric %s (%s) is not in docs/observability.md" % (name, family))

# The panels deploy/README.md describes.
required = [
    "mpilearn_job_train_loss", "mpilearn_job_validation_accuracy",
    "mpilearn_job_validation_loss", "mpilearn_job_samples_trained_total",
    "mpilearn_job_progress_ratio", "mpilearn_apply_duration_seconds_bucket",
    "mpilearn_update_staleness_bucket", "mpilearn_group_step_seconds_total",
    "mpilearn_job_groups", "mpilearn_job_ranks",
    "mpilearn_job_received_bytes_total", "mpilearn_job_sent_bytes_total",
    "mpilearn_rpc_duration_seconds_count",
    "mpilearn_job_snapshots_published_total",
    "mpilearn_job_snapshots_skipped_total",
    "mpilearn_studies", "mpilearn_study_best_value",
    "mpilearn_study_trials_created", "mpilearn_study_trials_running",
    "mpilearn_study_trials_budget", "mpilearn_study_epochs_trained",
]
for name in required:
    if name not in names:
        problems.append("no panel queries %s" % name)
if not any(re.search(r"histogram_quantile\(0\.99,.*by \(le, device, optimizer\).*mpilearn_apply_duration_seconds_bucket", e)
           for _, e in exprs):
    problems.append("no p99 apply time by device and optimizer")
if not any(p.get("type") in ("gauge", "bargauge") and
           any("mpilearn_job_progress_ratio" in t.get("expr", "") for t in p.get("targets", []))
           for p in panels):
    problems.append("progress is not a gauge or bar gauge")

# The PromQL, with the dashboard's variables filled in, as recording rules
# for `promtool check rules` (a syntax check).
def fill(expr):
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m")
    return re.sub(r"\$\{?[a-zA-Z_]+\}?", ".*", expr)
rules = ["groups:", "  - name: dashboard", "    rules:"]
for i, (title, expr) in enumerate(exprs):
    rules.append("      - record: dashboard:expr_%d" % i)
    rules.append("        expr: %s" % json.dumps(fill(expr)))
for name, query in var_queries:
    m = re.match(r"label_values\((.*),\s*[a-zA-Z_]+\)$", query)
    if not m:
        problems.append("variable %s: query %r is not label_values(SELECTOR, LABEL)" % (name, query))
        continue
    rules.append("      - record: dashboard:variable_%s" % name)
    rules.append("        expr: %s" % json.dumps(fill(m.group(1))))
with open(rules_path, "w") as f:
    f.write("\n".join(rules) + "\n")

for p in problems:
    print(p)
print("%d panels, %d queries, %d metric names" % (len(panels), len(exprs), len(names)))
sys.exit(1 if problems else 0)
PY
  )"; then
    ok "dashboard JSON and metric names ($out)"
  else
    fail "grafana/mpilearn-dashboard.json:"$'\n'"$out"
  fi
  if [[ ! -s "$TMP/dashboard_rules.yml" ]]; then
    skip "dashboard PromQL not parsed (no queries extracted)"
  elif [[ -n "$PROMTOOL" ]]; then
    if out="$("$PROMTOOL" check rules "$TMP/dashboard_rules.yml" 2>&1)"; then
      ok "dashboard PromQL parses (promtool check rules)"
    else
      fail "dashboard PromQL does not parse:"$'\n'"$out"$'\n'"$(cat "$TMP/dashboard_rules.yml")"
    fi
  else
    skip "promtool not found; dashboard PromQL not parsed"
  fi
else
  skip "python3 not found; dashboard JSON not checked"
fi

# --- systemd unit -------------------------------------------------------------
exec_start="$(grep -E '^ExecStart=' "$UNIT" || true)"
if [[ "$(wc -l <<<"$exec_start")" != 1 || -z "$exec_start" ]]; then
  fail "mpilearn-master.service: want exactly one ExecStart= line, got:"$'\n'"$exec_start"
elif ! grep -Eq '^ExecStart=/[^ ]*/mpilearn-master( |$)' <<<"$exec_start"; then
  fail "mpilearn-master.service: ExecStart does not run mpilearn-master: $exec_start"
elif ! grep -Eq -- '--metrics_listen[ =]127\.0\.0\.1:7071( |$)' <<<"$exec_start"; then
  fail "mpilearn-master.service: ExecStart has no --metrics_listen 127.0.0.1:7071: $exec_start"
else
  ok "mpilearn-master.service ExecStart"
fi
grep -Eq '^\[Install\]$' "$UNIT" || fail "mpilearn-master.service: no [Install] section"

# --- Slurm scripts ------------------------------------------------------------
SHELLCHECK="$(command -v shellcheck || true)"
for script in "$SBATCH" "$TRAIN_SBATCH"; do
  name="$(basename "$script")"
  if out="$(bash -n "$script" 2>&1)"; then
    ok "$name parses"
  else
    fail "$name: bash -n:"$'\n'"$out"
  fi
  if [[ -z "$SHELLCHECK" ]]; then
    skip "shellcheck not found; $name not checked by it"
  elif out="$("$SHELLCHECK" "$script" 2>&1)"; then
    ok "shellcheck $name"
  else
    fail "shellcheck $name:"$'\n'"$out"
  fi
done
grep -Eq '^mpirun ' "$SBATCH" || fail "slurm_group.sbatch: no mpirun line"
grep -Eq -- '--progress' "$SBATCH" || fail "slurm_group.sbatch: no --progress"
grep -Eq 'MPILEARN_TRACE_DIR' "$SBATCH" || fail "slurm_group.sbatch: no MPILEARN_TRACE_DIR"

if (( failures > 0 )); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "PASS"
