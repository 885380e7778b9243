#!/usr/bin/env bash
# Drives a real mpilearn-master with mpilearnctl: submit, list, status, wait,
# and every error path (bad specs, missing data, unknown job, unknown command,
# unreachable master), then checks the master still serves.
#
# Starts one master on a free port and kills exactly that process on exit.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:?must run under bazel test}/mpilearn"
CTL="$RUNFILES/tools/mpilearnctl"
MASTER="$RUNFILES/server/mpilearn-master"
SPEC="$RUNFILES/docs/examples/fashion_mnist.json"
TMP="${TEST_TMPDIR:?}"
MASTER_LOG="$TMP/master.log"

MASTER_PID=""
cleanup() {
  if [[ -n "$MASTER_PID" ]]; then
    kill "$MASTER_PID" 2>/dev/null || true
    wait "$MASTER_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  if [[ -f "$MASTER_LOG" ]]; then
    echo "--- master log ---" >&2
    cat "$MASTER_LOG" >&2
  fi
  exit 1
}

# expect RC PATTERN CMD...: runs CMD, requires exit status RC and output
# (stdout and stderr) matching the extended regex PATTERN. Sets $OUTPUT.
expect() {
  local want_rc="$1" pattern="$2"
  shift 2
  local rc=0
  OUTPUT="$("$@" 2>&1)" || rc=$?
  if [[ "$rc" != "$want_rc" ]]; then
    fail "'$*' exited $rc, want $want_rc; output:"$'\n'"$OUTPUT"
  fi
  if ! grep -Eq -- "$pattern" <<<"$OUTPUT"; then
    fail "'$*' output does not match /$pattern/:"$'\n'"$OUTPUT"
  fi
  echo "ok: $* -> exit $rc"
}

# --- Start the master on a free port. ------------------------------------
"$MASTER" --listen 127.0.0.1:0 --port_file "$TMP/port" \
  --state_dir "$TMP/state" >"$MASTER_LOG" 2>&1 &
MASTER_PID=$!
for _ in $(seq 200); do  # 20 s
  [[ -s "$TMP/port" ]] && break
  kill -0 "$MASTER_PID" 2>/dev/null || fail "mpilearn-master exited at startup"
  sleep 0.1
done
[[ -s "$TMP/port" ]] || fail "mpilearn-master wrote no port file within 20 s"
PORT="$(cat "$TMP/port")"
ADDR="127.0.0.1:$PORT"
echo "master pid $MASTER_PID on $ADDR"

ctl() { "$CTL" --master "$ADDR" --connect_timeout_s 5 "$@"; }

# --- Submit the example spec. ---------------------------------------------
submit_flags=()
if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
  echo "note: /usr/share/datasets/fashion-mnist absent; submitting with --skip_file_check"
  submit_flags=(--skip_file_check)
fi
rc=0
JOB="$(ctl submit "$SPEC" "${submit_flags[@]}")" || rc=$?
[[ "$rc" == 0 ]] || fail "submit exited $rc"
[[ "$JOB" == "job-000001" ]] || fail "submit printed '$JOB', want job-000001 alone"
echo "ok: submit -> $JOB"

# The address also comes from $MPILEARN_MASTER.
expect 0 "^$JOB +QUEUED +fashion-mnist-mlp +mlp +downpour +0/5 +0 +-$" \
  env MPILEARN_MASTER="$ADDR" "$CTL" list
grep -Eq '^JOB +STATE +NAME +MODEL +ALGORITHM +EPOCHS +UPDATES +TEST_ACC$' \
  <<<"$OUTPUT" || fail "list header missing:"$'\n'"$OUTPUT"

expect 0 '"state": "JOB_STATE_QUEUED"' ctl status "$JOB" --json
expect 0 '"job_id": "job-000001"' ctl status "$JOB" --json
expect 0 '^state +QUEUED$' ctl status "$JOB"
expect 0 '^epochs +0/5$' ctl status "$JOB"

# A queued job never finishes here: wait must give up with exit 3.
expect 3 "job-000001 still QUEUED" ctl wait "$JOB" --timeout_s 1.5

# --- Errors from the master. -----------------------------------------------
expect 1 "unknown job 'job-999999'" ctl status job-999999
expect 1 "unknown job 'job-999999'" ctl wait job-999999

# --- Specs rejected locally (exit 2), never reaching the master. -----------
printf '{"name": "broken", "epochs": ' >"$TMP/malformed.json"
expect 2 "not valid JSON" ctl submit "$TMP/malformed.json"

sed 's/"epochs": 5/"epochs": 0/' "$SPEC" >"$TMP/epochs0.json"
grep -q '"epochs": 0' "$TMP/epochs0.json" || fail "could not write the epochs=0 spec"
expect 2 "epochs must be in \[1, 100000\], got 0" ctl submit "$TMP/epochs0.json"

cat >"$TMP/missing_data.json" <<EOF
{
  "name": "missing-data",
  "data": {
    "train_images": "$TMP/no-such-train-images.gz",
    "train_labels": "$TMP/no-such-train-labels.gz"
  }
}
EOF
expect 2 "data.train_images: cannot read '$TMP/no-such-train-images.gz'.*skip_file_check" \
  ctl submit "$TMP/missing_data.json"

expect 2 "cannot read job spec" ctl submit "$TMP/no-such-spec.json"

# --- Usage errors (exit 2). -------------------------------------------------
expect 2 "unknown command 'frobnicate'" ctl frobnicate
expect 2 "missing argument" ctl status
expect 2 "missing argument" ctl submit
expect 2 "missing command" ctl
expect 2 "unknown flag '--no_such_flag'" ctl --no_such_flag list

# --help lists the commands (absl exits 1 after printing help).
expect 1 "submit SPEC.json" "$CTL" --help

# --- Nothing listens on port 1: exit 1, bounded by --connect_timeout_s. ----
start=$SECONDS
expect 1 "cannot reach mpilearn-master at 127.0.0.1:1" \
  timeout 30 "$CTL" --master 127.0.0.1:1 --connect_timeout_s 2 list
(( SECONDS - start <= 10 )) || fail "unreachable master took $((SECONDS - start)) s"

# --- Nothing above disturbed the master: one job, still queued. ------------
kill -0 "$MASTER_PID" 2>/dev/null || fail "mpilearn-master died"
expect 0 "^$JOB +QUEUED" ctl list
[[ "$(grep -c '^job-' <<<"$OUTPUT")" == 1 ]] || \
  fail "want exactly one job listed:"$'\n'"$OUTPUT"

echo "PASS"
