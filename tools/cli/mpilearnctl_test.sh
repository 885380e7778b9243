#!/usr/bin/env bash
# Drives a real mpilearn-master with mpilearnctl: version, submit, list
# (--state), queue (order by priority), status (the jobs table and one job's
# summary and sections), wait, cancel, delete, and every error path
# (bad specs, missing data, unknown job, unknown command, unreachable
# master), then checks the master still serves.
#
# Starts one master on a free port and kills exactly that process on exit.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:?must run under bazel test}/mpilearn"
CTL="$RUNFILES/tools/cli/mpilearnctl"
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
# Metrics on a free port too: the default 127.0.0.1:7071 may be taken by
# another test's master.
"$MASTER" --listen 127.0.0.1:0 --port_file "$TMP/port" \
  --metrics_listen 127.0.0.1:0 \
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

# check_table TEXT: every line of TEXT (a table mpilearnctl printed, header
# first) has no trailing blanks and its cells start at the same columns as
# the header's. Cells are separated by two or more blanks; one blank may
# occur inside a cell ("2 (4 ranks)").
check_table() {
  local text="$1"
  if grep -n ' $' <<<"$text" >/dev/null; then
    fail "table has trailing blanks:"$'\n'"$(cat -A <<<"$text")"
  fi
  local starts
  starts="$(awk '{
      line = $0; pos = 0; out = ""
      while (match(line, /[^ ]+( [^ ]+)*/)) {
        out = out " " (pos + RSTART); pos += RSTART + RLENGTH - 1
        line = substr(line, RSTART + RLENGTH)
      }
      print out
    }' <<<"$text" | sort -u)"
  [[ "$(wc -l <<<"$starts")" == 1 ]] || \
    fail "table columns not aligned (cell starts per line: $starts):"$'\n'"$text"
}

# The jobs table and the queue of a master without jobs.
expect 0 "^no jobs on the master at $ADDR$" ctl status
expect 0 "^no queued jobs on the master at $ADDR$" ctl queue

# --- version: this build's release is the master's; no tokens: admin. ----
expect 0 '^client +[0-9]+\.[0-9]+\.[0-9]+[^ ]* \(mpilearnctl\)$' ctl version
CLIENT_VERSION="$(sed -nE 's/^client +([^ ]+) .*/\1/p' <<<"$OUTPUT")"
grep -Eq "^master +${CLIENT_VERSION//./\\.} at $ADDR$" <<<"$OUTPUT" || \
  fail "version: the master's line does not show $CLIENT_VERSION at $ADDR:"$'\n'"$OUTPUT"
grep -Eq '^caller +- \(role admin\)$' <<<"$OUTPUT" || \
  fail "version: a master without tokens makes every caller an admin:"$'\n'"$OUTPUT"
[[ "$(wc -l <<<"$OUTPUT")" == 3 ]] || fail "version: want 3 lines:"$'\n'"$OUTPUT"
check_table "$OUTPUT"

# --- Health (grpc.health.v1): the whole master and each service. ----------
expect 0 "^SERVING$" ctl health
expect 0 "^SERVING$" ctl health mpilearn.v1.Master
expect 0 "^SERVING$" ctl health mpilearn.v1.Studies
expect 1 "no health status for service 'mpilearn.v1.Nothing'" ctl health mpilearn.v1.Nothing

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
# OWNER is "-": a master without tokens has no names.
expect 0 "^$JOB +QUEUED +- +fashion-mnist-mlp +mlp +downpour +0/5 +0 +-$" \
  env MPILEARN_MASTER="$ADDR" "$CTL" list
grep -Eq '^JOB +STATE +OWNER +NAME +MODEL +ALGORITHM +EPOCHS +UPDATES +TEST_ACC$' \
  <<<"$OUTPUT" || fail "list header missing:"$'\n'"$OUTPUT"
check_table "$OUTPUT"

QUEUE_HEADER='^POS +JOB +OWNER +PRIORITY +STUDY +NAME$'
expect 0 "^1 +$JOB +- +0 +- +fashion-mnist-mlp$" ctl queue
grep -Eq "$QUEUE_HEADER" <<<"$OUTPUT" || fail "queue header missing:"$'\n'"$OUTPUT"
[[ "$(wc -l <<<"$OUTPUT")" == 2 ]] || fail "queue: want header and one row:"$'\n'"$OUTPUT"

expect 0 '"state": "JOB_STATE_QUEUED"' ctl status "$JOB" --json
expect 0 '"job_id": "job-000001"' ctl status "$JOB" --json
expect 0 '"jobs": \[' ctl status --json
grep -q '"job_id": "job-000001"' <<<"$OUTPUT" || \
  fail "status --json lists no job-000001:"$'\n'"$OUTPUT"

# status without a job id: one row per job. PROGRESS and LOSS depend on
# fields the master fills once groups train (samples_per_epoch, train_loss),
# so only their presence is checked; a queued job has no history, no
# validation, no test result and no group.
STATUS_HEADER='^JOB +NAME +STATE +EPOCH +PROGRESS +SAMPLES/S +LOSS +VAL_ACC +TEST_ACC +GROUPS$'
expect 0 "$STATUS_HEADER" ctl status
grep -Eq "^$JOB +fashion-mnist-mlp +QUEUED +0/5 +[^ ]+ +- +[^ ]+ +- +- +0$" \
  <<<"$OUTPUT" || fail "status: no row for $JOB:"$'\n'"$OUTPUT"
[[ "$(wc -l <<<"$OUTPUT")" == 2 ]] || fail "status: want header and one row:"$'\n'"$OUTPUT"
check_table "$OUTPUT"
echo "ok: status table"

# status JOB: the summary block, then the GROUPS, EPOCHS and VALIDATIONS
# sections (empty for a queued job).
expect 0 '^state +QUEUED$' ctl status "$JOB"
DETAIL="$OUTPUT"
for pattern in \
    "^job +$JOB$" \
    '^name +fashion-mnist-mlp$' \
    '^algorithm +downpour$' \
    '^model +mlp' \
    '^optimizer +adam \(lr 0.001\)$' \
    '^epochs +0/5$' \
    '^progress +' \
    '^version +0$' \
    '^updates +0 applied, 0 units requeued$' \
    '^staleness +mean 0.00, max 0, rejected 0$' \
    '^snapshots +0 published, 0 skipped$' \
    '^checkpoint +' \
    '^GROUPS$' \
    '^EPOCHS$' \
    '^VALIDATIONS$'; do
  grep -Eq -- "$pattern" <<<"$DETAIL" || \
    fail "status $JOB: no line matching /$pattern/:"$'\n'"$DETAIL"
done
# The sections come in this order, each followed by its (empty) content.
sections="$(grep -E -A1 '^(GROUPS|EPOCHS|VALIDATIONS)$' <<<"$DETAIL" | grep -v '^--$')"
[[ "$sections" == $'GROUPS\n  none\nEPOCHS\n  none completed yet\nVALIDATIONS\n  none yet' ]] || \
  fail "status $JOB: unexpected sections:"$'\n'"$sections"
# The summary block (up to the first blank line) is an aligned table too.
check_table "$(sed '/^$/q' <<<"$DETAIL" | sed '/^$/d')"
echo "ok: status $JOB sections"

# A queued job never finishes here: wait must give up with exit 3.
expect 3 "job-000001 still QUEUED" ctl wait "$JOB" --timeout_s 1.5

# --- Errors from the master. -----------------------------------------------
expect 1 "unknown job 'job-999999'" ctl status job-999999
expect 1 "unknown job 'job-999999'" ctl wait job-999999
expect 1 "unknown job 'job-999999'" ctl status job-999999 --json

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

# File lists are read as the workers read them: a list file naming one
# present and one missing file fails on the missing one; an empty list and
# a missing list fail naming their field.
: >"$TMP/present.h5"
printf '# training files\npresent.h5\nabsent.h5\n' >"$TMP/train_list.txt"
printf '# nothing\n' >"$TMP/empty_list.txt"
for list in train_list empty_list no_such_list; do
  printf '{"data": {"train_files": ["%s"]}}\n' "$TMP/$list.txt" >"$TMP/$list.json"
done
expect 2 "data.train_files \(file 2 of 2\): cannot read '$TMP/absent.h5'.*skip_file_check" \
  ctl submit "$TMP/train_list.json"
expect 2 "data.train_files: the file list '$TMP/empty_list.txt' names no files" \
  ctl submit "$TMP/empty_list.json"
expect 2 "data.train_files: cannot read the file list '$TMP/no_such_list.txt'" \
  ctl submit "$TMP/no_such_list.json"
# Control bytes in a string are refused here as the master refuses them.
printf '{"name": "tab\\there", "data": {"train_files": ["%s"]}}\n' "$TMP/present.h5" \
  >"$TMP/control.json"
expect 2 "spec.name.*control" ctl submit "$TMP/control.json"

# --- Usage errors (exit 2). -------------------------------------------------
expect 2 "unknown command 'frobnicate'.*queue, version" ctl frobnicate
expect 2 "unexpected argument 'extra' after 'queue'" ctl queue extra
expect 2 "unexpected argument 'extra' after 'version'" ctl version extra
expect 2 "missing argument" ctl wait
expect 2 "missing argument" ctl submit
expect 2 "unexpected argument 'extra' after 'status'" ctl status "$JOB" extra
expect 2 "missing command" ctl
expect 2 "unknown flag '--no_such_flag'" ctl --no_such_flag list

# --help lists the commands (absl exits 1 after printing help).
expect 1 "submit SPEC.json" "$CTL" --help
for command in queue version; do
  grep -Eq "^  $command +" <<<"$OUTPUT" || fail "--help does not list $command:"$'\n'"$OUTPUT"
done

# --- Nothing listens on port 1: exit 1, bounded by --connect_timeout_s. ----
start=$SECONDS
expect 1 "cannot reach mpilearn-master at 127.0.0.1:1" \
  timeout 30 "$CTL" --master 127.0.0.1:1 --connect_timeout_s 2 list
(( SECONDS - start <= 10 )) || fail "unreachable master took $((SECONDS - start)) s"
# status names the address, where it came from, and how to start a master.
expect 1 "address 127.0.0.1:1 taken from --master; start a master there with .mpilearn-master --listen 127.0.0.1:1" \
  timeout 30 "$CTL" --master 127.0.0.1:1 --connect_timeout_s 2 status
expect 1 "address 127.0.0.1:1 taken from \\\$MPILEARN_MASTER" \
  env MPILEARN_MASTER=127.0.0.1:1 timeout 30 "$CTL" --connect_timeout_s 2 status "$JOB"
expect 1 "cannot reach mpilearn-master at 127.0.0.1:1" \
  timeout 30 "$CTL" --master 127.0.0.1:1 --connect_timeout_s 2 version

# --- Nothing above disturbed the master: one job, still queued. ------------
kill -0 "$MASTER_PID" 2>/dev/null || fail "mpilearn-master died"
expect 0 "^$JOB +QUEUED" ctl list
[[ "$(grep -c '^job-' <<<"$OUTPUT")" == 1 ]] || \
  fail "want exactly one job listed:"$'\n'"$OUTPUT"

# --- A second job with a longer name and a higher priority: the jobs table
# stays aligned, and the queue puts the second job first. ---------------
sed 's/"name": "fashion-mnist-mlp"/"name": "fashion-mnist-mlp-second-job", "priority": 10/' \
  "$SPEC" >"$TMP/second.json"
grep -q 'second-job' "$TMP/second.json" || fail "could not write the second spec"
JOB2="$(ctl submit "$TMP/second.json" "${submit_flags[@]}")" || fail "second submit failed"
expect 0 "$QUEUE_HEADER" ctl queue
want_queue="1 $JOB2 - 10 - fashion-mnist-mlp-second-job
2 $JOB - 0 - fashion-mnist-mlp"
[[ "$(tail -n +2 <<<"$OUTPUT" | tr -s ' ')" == "$want_queue" ]] || \
  fail "queue: want $JOB2 (priority 10) before $JOB:"$'\n'"$OUTPUT"
check_table "$OUTPUT"
expect 0 '"queue_position": 1' ctl queue --json
ids="$(grep -oE '"job_id": "[^"]+"' <<<"$OUTPUT" | tr '\n' ' ')"
[[ "$ids" == "\"job_id\": \"$JOB2\" \"job_id\": \"$JOB\" " ]] || \
  fail "queue --json: want $JOB2 then $JOB, got $ids:"$'\n'"$OUTPUT"
echo "ok: queue in priority order"
expect 0 "^$JOB2 +fashion-mnist-mlp-second-job +QUEUED +0/5 " ctl status
grep -Eq "$STATUS_HEADER" <<<"$OUTPUT" || fail "status header missing:"$'\n'"$OUTPUT"
grep -Eq "^$JOB +fashion-mnist-mlp +QUEUED +0/5 " <<<"$OUTPUT" || \
  fail "status: no row for $JOB:"$'\n'"$OUTPUT"
[[ "$(wc -l <<<"$OUTPUT")" == 3 ]] || fail "status: want header and two rows:"$'\n'"$OUTPUT"
check_table "$OUTPUT"
echo "ok: status table with two jobs"

# --- cancel, delete, list --state. -----------------------------------------
expect 1 "cancel it first: mpilearnctl cancel $JOB2" ctl delete "$JOB2"
expect 0 "^$JOB2 CANCELLED$" ctl cancel "$JOB2" --reason "not needed"
expect 0 "^message +cancelled: not needed$" ctl status "$JOB2"
expect 1 "has already ended \\(JOB_STATE_CANCELLED\\); nothing to cancel" \
  ctl cancel "$JOB2"
expect 1 "job $JOB2 was cancelled: cancelled: not needed" ctl wait "$JOB2"
expect 0 "^$JOB2 +CANCELLED" ctl list --state cancelled
[[ "$(grep -c '^job-' <<<"$OUTPUT")" == 1 ]] || \
  fail "list --state cancelled: want $JOB2 alone:"$'\n'"$OUTPUT"
expect 0 "^$JOB +QUEUED" ctl list --state queued,running
[[ "$(grep -c '^job-' <<<"$OUTPUT")" == 1 ]] || \
  fail "list --state queued,running: want $JOB alone:"$'\n'"$OUTPUT"
expect 2 "--state: unknown state 'sleeping'" ctl list --state sleeping
expect 0 "^$JOB2 deleted$" ctl delete "$JOB2"
expect 1 "unknown job '$JOB2'" ctl status "$JOB2"
expect 1 "unknown job '$JOB2'" ctl delete "$JOB2"
expect 2 "missing argument: mpilearnctl cancel JOB_ID" ctl cancel
expect 2 "missing argument: mpilearnctl delete JOB_ID" ctl delete
[[ -d "$TMP/state/jobs/$JOB2" ]] && fail "delete left $TMP/state/jobs/$JOB2"
expect 0 "^$JOB +QUEUED" ctl list
[[ "$(grep -c '^job-' <<<"$OUTPUT")" == 1 ]] || \
  fail "after delete: want $JOB alone:"$'\n'"$OUTPUT"
# The cancelled job left the queue: the first job is next again.
expect 0 "^1 +$JOB +" ctl queue
[[ "$(grep -c '^[0-9]' <<<"$OUTPUT")" == 1 ]] || \
  fail "queue after cancel: want $JOB alone:"$'\n'"$OUTPUT"
echo "ok: cancel, delete, list --state"

echo "PASS"
