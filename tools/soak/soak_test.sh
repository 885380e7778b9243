#!/usr/bin/env bash
# Runs the soak with small settings (4 groups for 10 s, 20 churn jobs)
# against the master it starts, and checks: it passes (exit 0), stdout is
# exactly one JSON object with the report's fields and sane values, the
# master it started is gone and its temporary directory removed; then the
# usage errors (exit 2) and --help (exit 0).
set -euo pipefail

RUNFILES="${TEST_SRCDIR:?must run under bazel test}/mpilearn"
SOAK="$RUNFILES/tools/soak/soak"
TMP="${TEST_TMPDIR:?}"
PYTHON=/usr/bin/python3

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# The soak makes its temporary directory under $TMPDIR: give it an empty
# one, to check that nothing is left there.
export TMPDIR="$TMP/soak-tmp"
mkdir -p "$TMPDIR"

rc=0
"$SOAK" --groups=4 --seconds=10 --jobs=20 --json >"$TMP/out.json" \
  2>"$TMP/err.txt" || rc=$?
if [[ "$rc" != 0 ]]; then
  cat "$TMP/err.txt" >&2
  fail "soak exited $rc; stdout: $(cat "$TMP/out.json")"
fi
echo "ok: soak --groups=4 --seconds=10 --jobs=20 --json passed"

pid="$(sed -n 's/.*started mpilearn-master at .* (pid \([0-9]*\),.*/\1/p' "$TMP/err.txt")"
[[ -n "$pid" ]] || fail "no 'started mpilearn-master ... (pid N' line on stderr"
if kill -0 "$pid" 2>/dev/null; then
  fail "the master (pid $pid) still runs after the soak ended"
fi
if [[ -n "$(ls -A "$TMPDIR")" ]]; then
  fail "the soak left files in \$TMPDIR: $(ls -A "$TMPDIR")"
fi
echo "ok: master $pid gone, temporary directory removed"

if [[ -x "$PYTHON" ]]; then
  "$PYTHON" - "$TMP/out.json" <<'PY' || fail "JSON checks failed: $(cat "$TMP/out.json")"
import json, sys
text = open(sys.argv[1]).read()
report = json.loads(text)  # the whole of stdout: exactly one object
assert isinstance(report, dict), report
for field in ["groups", "seconds", "rpcs_total", "rpcs_per_second", "errors",
              "unexpected_errors", "check_failures", "rss_mib_start",
              "rss_mib_warm", "rss_mib_end", "rss_mib_max",
              "rss_slope_mib_per_min", "churn_jobs", "churn_seconds",
              "churn_rss_start_mib", "churn_rss_end_mib",
              "churn_rss_peak_mib", "pass"]:
    assert field in report, "missing " + field
assert report["pass"] is True, report
assert report["groups"] == 4 and report["churn_jobs"] == 20, report
assert report["rpcs_total"] > 0 and report["rpcs_per_second"] > 0, report
assert report["unexpected_errors"] == {} and report["check_failures"] == 0, report
assert report["jobs_completed"] >= 1, report
# Each churn job's GetJobStatus after DeleteJob is an expected NOT_FOUND.
assert report["errors"].get("NOT_FOUND", 0) >= 20, report
for field in ["rss_mib_start", "rss_mib_warm", "rss_mib_end", "rss_mib_max",
              "churn_rss_start_mib", "churn_rss_end_mib", "churn_rss_peak_mib"]:
    assert report[field] is not None and report[field] > 0, field
assert report["rss_mib_max"] >= report["rss_mib_warm"], report
assert report["churn_rss_peak_mib"] >= report["churn_rss_end_mib"], report
print("ok: JSON report")
PY
else
  grep -q '"pass": true' "$TMP/out.json" || fail "no \"pass\": true"
  echo "ok: JSON report (grep only: no $PYTHON)"
fi

# expect_usage ARGS...: exit 2 and a message naming the flag.
expect_usage() {
  local pattern="$1"
  shift
  local out rc=0
  out="$("$SOAK" "$@" 2>&1)" || rc=$?
  [[ "$rc" == 2 ]] || fail "soak $* exited $rc, want 2: $out"
  grep -q -- "$pattern" <<<"$out" || fail "soak $*: no '$pattern' in: $out"
  echo "ok: soak $* -> usage error"
}
expect_usage "--groups must be in" --groups=0
expect_usage "--seconds must be in" --seconds=1
expect_usage "--phase" --phase=forever
expect_usage "--jobs must be in" --jobs=-3
expect_usage "--master_pid needs --master" --master_pid=1
expect_usage "unknown flag" --no_such_flag
expect_usage "mpilearn-master" --master_bin=/nonexistent/mpilearn-master

out="$("$SOAK" --help)" || fail "soak --help failed"
grep -q -- "--churn_concurrency" <<<"$out" || fail "--help lacks the flags"
echo "ok: soak --help"
echo PASS
