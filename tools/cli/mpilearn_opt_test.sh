#!/usr/bin/env bash
# Drives a real mpilearn-master's Studies service with mpilearn-opt and one
# real serving worker group: spec and usage errors, create --watch (plain
# event lines, then the best trial), list, status, best --spec against the
# best trial's parameters, export as CSV and JSON, a study ended early by
# --target, and an external study driven by ask / tell / cancel.
#
# Starts one master on a free port and one `mpirun -np 1 mpilearn-worker
# --serve` group, and kills exactly those two processes on exit. The trials
# are tiny (2,000 Fashion-MNIST images, 2 epochs, a 32-unit MLP): the whole
# test takes well under a minute. Passes with a SKIP line when the
# Fashion-MNIST files are absent.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:?must run under bazel test}/mpilearn"
OPT="$RUNFILES/tools/cli/mpilearn-opt"
MASTER="$RUNFILES/server/mpilearn-master"
WORKER="$RUNFILES/worker/mpilearn-worker"
EXAMPLE="$RUNFILES/docs/examples/opt_fashion_mnist.yaml"
KFOLD_EXAMPLE="$RUNFILES/docs/examples/opt_kfold_fashion_mnist.yaml"
TMP="${TEST_TMPDIR:?}"
MASTER_LOG="$TMP/master.log"
WORKER_LOG="$TMP/worker.log"
DATA=/usr/share/datasets/fashion-mnist
PYTHON=/usr/bin/python3

for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz \
    t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  if [[ ! -f "$DATA/$f" ]]; then
    echo "SKIP: $DATA/$f is missing (the Fashion-MNIST files the trials train on)"
    exit 0
  fi
done

MASTER_PID=""
WORKER_PID=""
# Ends one process this script started (by its pid) and reaps it.
stop() {
  local pid="$1"
  if [[ -n "$pid" ]]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
}
cleanup() {
  # The group first: mpirun, signalled, ends its ranks.
  stop "$WORKER_PID"
  stop "$MASTER_PID"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  local log
  for log in "$MASTER_LOG" "$WORKER_LOG"; do
    if [[ -f "$log" ]]; then
      echo "--- $log (last 60 lines) ---" >&2
      tail -n 60 "$log" >&2
    fi
  done
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
  --metrics_listen 127.0.0.1:0 \
  --state_dir "$TMP/state" >"$MASTER_LOG" 2>&1 &
MASTER_PID=$!
for _ in $(seq 200); do  # 20 s
  [[ -s "$TMP/port" ]] && break
  kill -0 "$MASTER_PID" 2>/dev/null || fail "mpilearn-master exited at startup"
  sleep 0.1
done
[[ -s "$TMP/port" ]] || fail "mpilearn-master wrote no port file within 20 s"
ADDR="127.0.0.1:$(cat "$TMP/port")"
echo "master pid $MASTER_PID on $ADDR"

# Every call bounded: 60 s covers a watch of the tiny studies below many
# times over.
opt() { timeout 60 "$OPT" --master "$ADDR" --connect_timeout_s 5 "$@"; }

# --- A tiny study: the example's base and parameters, cut down. -----------
# The example file itself must pass the local checks (it reaches the
# master, which refuses nothing in it); its study is cancelled at once so
# no worker ever takes its trials.
expect 0 "^study s-1 created$" opt create "$EXAMPLE" --trials 1 --parallelism 1
expect 0 "^study s-1 CANCELLED" opt cancel s-1 --reason "not trained here"

STUDY="$TMP/tiny.yaml"
cat >"$STUDY" <<EOF
name: tiny-fashion-mnist
base:
  model: {name: mlp, hidden: [32]}
  data:
    train_images: $DATA/train-images-idx3-ubyte.gz
    train_labels: $DATA/train-labels-idx1-ubyte.gz
    test_images: $DATA/t10k-images-idx3-ubyte.gz
    test_labels: $DATA/t10k-labels-idx1-ubyte.gz
    train_limit: 2000
    validation_count: 500
    test_limit: 500
  optimizer: {name: adam, learning_rate: 0.001}
  algorithm: downpour
  epochs: 2
  batch_size: 64
parameters:
  - path: optimizer.learning_rate
    real: {low: 0.0005, high: 0.01, log: true}
  - path: batch_size
    int: {low: 32, high: 128, step: 32}
sampler: random
trials: 3
parallelism: 1
seed: 3
EOF

# --- Spec and usage errors: nothing created. -------------------------------
sed 's/path: batch_size/path: no_such_field/' "$STUDY" >"$TMP/bad_path.yaml"
grep -q 'no_such_field' "$TMP/bad_path.yaml" || fail "could not write bad_path.yaml"
expect 1 "parameters\[1\] \(no_such_field\): no field 'no_such_field'" \
  opt create "$TMP/bad_path.yaml"

sed 's/^trials: 3$/trials: 0/' "$STUDY" >"$TMP/trials0.yaml"
grep -q '^trials: 0$' "$TMP/trials0.yaml" || fail "could not write trials0.yaml"
expect 1 "trials: 0; give a budget of 1 to" opt create "$TMP/trials0.yaml"

{ cat "$STUDY"; echo "no_such_option: 1"; } >"$TMP/unknown_field.yaml"
expect 2 "unknown_field.yaml: .*no_such_option" opt create "$TMP/unknown_field.yaml"

expect 2 "no-such-study.yaml: cannot read" opt create "$TMP/no-such-study.yaml"

expect 2 "--trials must be >= 1, got 0" opt create "$STUDY" --trials 0
expect 2 "--parallelism must be >= 1, got -2" opt create "$STUDY" --parallelism -2
expect 2 "--folds must be 2 to 20, got 1" opt create "$STUDY" --folds 1
# The master refuses k-fold trials over a base that holds out rows itself.
expect 1 "folds: the folds choose the validation rows; remove base.data.validation_count" \
  opt create "$STUDY" --folds 3
expect 2 "--target must be a finite number" opt create "$STUDY" --target nan
expect 2 "--target does not go with 'status'" opt status s-1 --target 0.5
expect 2 "--trials does not go with 'ask'" opt ask s-1 --trials 3
# --help documents the new flags (absl exits 1 after printing help).
expect 1 "create STUDY.\(json\|yaml\) \[--watch\] \[--target V\] \[--trials N\]" \
  "$OPT" --help
grep -q -- "--parallelism N" <<<"$OUTPUT" || fail "--help: no --parallelism"
grep -q -- "--folds K" <<<"$OUTPUT" || fail "--help: no --folds"

# Unknown study: the master's NOT_FOUND message, exit 1.
expect 1 "unknown study 's-99'" opt status s-99
expect 1 "unknown study 's-99'" opt best s-99
expect 1 "unknown study 's-99'" opt watch s-99

expect 0 "^s-1 +fashion-mnist-mlp-search +CANCELLED +tpe +1 +0 " opt list
[[ "$(grep -c '^s-' <<<"$OUTPUT")" == 1 ]] || \
  fail "after the errors want only s-1 listed:"$'\n'"$OUTPUT"

# --- One serving group, then create --watch. -------------------------------
# Open MPI keeps its session directory and shared memory under TMPDIR, per
# test (see tests/test_process.cc StartWorkers).
export TMPDIR="$TMP" OMPI_MCA_btl_vader_backing_directory="$TMP"
mpirun --allow-run-as-root --oversubscribe -np 1 "$WORKER" \
  --master "$ADDR" --serve --threads=1 --exit_when_idle_s=5 --progress=off \
  >"$WORKER_LOG" 2>&1 &
WORKER_PID=$!
echo "worker group (mpirun) pid $WORKER_PID"

expect 0 "^study s-2 COMPLETED: all 3 trials ended" opt create "$STUDY" --watch
WATCH="$OUTPUT"
# The target study is created at once, while the group is still serving
# (it leaves after 5 s without a queued job); it is checked below.
TARGET_STUDY="$(opt create "$STUDY" --target 0.01 --trials 10)" || \
  fail "create --target failed: $TARGET_STUDY"
[[ "$TARGET_STUDY" == "study s-3 created" ]] || \
  fail "create --target printed '$TARGET_STUDY'"

# Plain watch lines (stdout is no terminal): the headline, each trial
# queued and completed, the study's end, then the best trial block. Trial 0
# was created before the watch began, so its first line is a snapshot: the
# group may have taken its job already.
grep -Eq '^study s-2 \(tiny-fashion-mnist\) RUNNING' <<<"$WATCH" || \
  fail "watch: no headline:"$'\n'"$WATCH"
grep -Eq "^trial 0 (QUEUED|RUNNING) job job-[0-9]+ .*\(learning_rate=" <<<"$WATCH" || \
  fail "watch: no first line for trial 0:"$'\n'"$WATCH"
for n in 0 1 2; do
  if (( n > 0 )); then
    grep -Eq "^trial $n QUEUED job job-[0-9]+ \(learning_rate=" <<<"$WATCH" || \
      fail "watch: no QUEUED line for trial $n:"$'\n'"$WATCH"
  fi
  grep -Eq "^trial $n COMPLETED at epoch 2 value=0\.[0-9]+" <<<"$WATCH" || \
    fail "watch: no COMPLETED line for trial $n:"$'\n'"$WATCH"
done
# Ends with the best trial: the block after the last blank line.
BEST_BLOCK="$(awk 'BEGIN { RS = "" } { block = $0 } END { print block }' <<<"$WATCH")"
grep -Eq '^study +s-2$' <<<"$BEST_BLOCK" || fail "watch: last block:"$'\n'"$BEST_BLOCK"
grep -Eq '^trial +[0-2] \(COMPLETED, 2 epochs\)$' <<<"$BEST_BLOCK" || \
  fail "watch: no best trial at the end:"$'\n'"$WATCH"
grep -Eq '^params +optimizer.learning_rate=[0-9.e-]+ batch_size=(32|64|96|128)$' \
  <<<"$BEST_BLOCK" || fail "watch: best trial's params:"$'\n'"$BEST_BLOCK"
echo "ok: watch lines and best trial"

# list and status show the ended study.
expect 0 '^s-2 +tiny-fashion-mnist +COMPLETED +random +3 +0 +[0-2] +0\.[0-9]+ +6$' opt list
grep -Eq '^STUDY +NAME +STATE +SAMPLER +BUDGET +RUNNING +BEST_TRIAL +BEST_VALUE +EPOCHS$' \
  <<<"$OUTPUT" || fail "list header:"$'\n'"$OUTPUT"
expect 0 '^state +COMPLETED$' opt status s-2
STATUS="$OUTPUT"
grep -Eq '^trials +3 of 3: 3 completed$' <<<"$STATUS" || fail "status:"$'\n'"$STATUS"
grep -Eq '^TRIAL +STATE +EPOCHS +VALUE +BEST +PARAMS$' <<<"$STATUS" || \
  fail "status: no trials table:"$'\n'"$STATUS"
[[ "$(grep -Ec '^[0-2] +COMPLETED +2 +0\.[0-9]+ ' <<<"$STATUS")" == 3 ]] || \
  fail "status: want 3 COMPLETED trial rows:"$'\n'"$STATUS"
[[ "$(grep -Ec ' \* +learning_rate=' <<<"$STATUS")" == 1 ]] || \
  fail "status: want one best marker:"$'\n'"$STATUS"
echo "ok: list and status"

# --- best --spec: the trial job's spec carries the best trial's values. ----
opt best s-2 --spec >"$TMP/best_spec.json" || fail "best --spec failed"
opt export s-2 --format json >"$TMP/s-2.json" || fail "export --format json failed"
"$PYTHON" -c 'import json,sys; json.load(sys.stdin)' <"$TMP/s-2.json" || \
  fail "export --format json is not JSON:"$'\n'"$(head -c 2000 "$TMP/s-2.json")"
"$PYTHON" - "$TMP/best_spec.json" "$TMP/s-2.json" <<'EOF' || fail "best --spec does not match the best trial"
import json, sys
spec = json.load(open(sys.argv[1]))
study = json.load(open(sys.argv[2]))
best = study["best_trial"]
# Proto3 JSON leaves out zeros: trial 0 has no "number".
trial = next(t for t in study["trials"] if t.get("number", 0) == best)
assert trial["state"] == "TRIAL_STATE_COMPLETED", trial
assert spec["name"] == "s-2/trial-%d" % best, spec["name"]
assert len(trial["params"]) == 2, trial["params"]
for path, want in trial["params"].items():
    got = spec
    for part in path.split("."):
        got = got[part]
    if got != want:
        sys.exit("%s: spec has %r, best trial %r" % (path, got, want))
    print("ok: best --spec %s = %r" % (path, got))
EOF

# --- export --format csv: the parameter paths, one row per trial. ----------
expect 0 '^number,state,value,epochs_trained,retries,job_id,optimizer\.learning_rate,batch_size,epoch_1,epoch_2$' \
  opt export s-2 --format csv
CSV="$OUTPUT"
[[ "$(wc -l <<<"$CSV")" == 4 ]] || fail "export csv: want a header and 3 rows:"$'\n'"$CSV"
for n in 0 1 2; do
  grep -Eq "^$n,COMPLETED,0\.[0-9]+,2,0,job-[0-9]+,[0-9.e-]+,(32|64|96|128),0\.[0-9]+,0\.[0-9]+$" \
    <<<"$CSV" || fail "export csv: no row for trial $n:"$'\n'"$CSV"
done
expect 2 "--format must be csv or json, got 'xml'" opt export s-2 --format xml
echo "ok: export"

# --- --target: ends the study early. ----------------------------------------
# Any validation accuracy reaches 0.01, so the first trial's first value ends
# the study; it may have created a second trial by then, never ten.
expect 0 "^study s-3 COMPLETED: target val_accuracy 0.01 reached by trial [0-9]" \
  opt watch s-3
expect 0 '^message +target val_accuracy 0.01 reached' opt status s-3
TRIAL_ROWS="$(grep -Ec '^[0-9]+ +[A-Z]+ ' <<<"$OUTPUT")" || true
(( TRIAL_ROWS >= 1 && TRIAL_ROWS < 10 )) || \
  fail "target study: want 1 to 9 trials, got $TRIAL_ROWS:"$'\n'"$OUTPUT"
grep -Eq '^state +COMPLETED$' <<<"$OUTPUT" || fail "target study not COMPLETED:"$'\n'"$OUTPUT"
grep -Eq '^trials +[0-9] of 10: ' <<<"$OUTPUT" || fail "target study budget:"$'\n'"$OUTPUT"
echo "ok: --target ended s-3 after $TRIAL_ROWS of 10 trials"

# --- An external study: ask, tell, cancel. ----------------------------------
# Many epochs, so a trial the group takes is still training when told.
sed -e 's/^sampler: random$/sampler: external/' -e 's/^  epochs: 2$/  epochs: 200/' \
  "$STUDY" >"$TMP/external.yaml"
grep -q '^sampler: external$' "$TMP/external.yaml" || fail "could not write external.yaml"
expect 0 "^study s-4 created$" opt create "$TMP/external.yaml"
# No sampler to propose values: the master refuses an ask without them.
expect 1 "params: study s-4 has sampler \"external\"; give a value for every parameter" \
  opt ask s-4
expect 0 "^trial 0 QUEUED job job-[0-9]+ \(batch_size=64 learning_rate=0.002\)$" \
  opt ask s-4 --params '{"optimizer.learning_rate": 0.002, "batch_size": 64}'
expect 2 "--params must be a JSON object" opt ask s-4 --params '{bad'
# Queued, or running on the group: either way not ended yet.
expect 0 '^0 +(QUEUED|RUNNING) ' opt status s-4
expect 0 "^trial 0 PRUNED .*: told by the test$" \
  opt tell s-4 --trial 0 --state pruned --message "told by the test"
expect 0 '^0 +PRUNED ' opt status s-4
expect 0 "^study s-4 CANCELLED" opt cancel s-4
expect 0 '^state +CANCELLED$' opt status s-4
expect 0 '^s-4 +tiny-fashion-mnist +CANCELLED +external ' opt list

# --- The k-fold example: the master takes it; each trial is three jobs. -------
expect 0 "^study s-5 created$" opt create "$KFOLD_EXAMPLE" --trials 1
expect 0 '^folds +3 \(one job per fold, scored by the mean\)$' opt status s-5
grep -Eq "^0 +(QUEUED|RUNNING) " <<<"$OUTPUT" || fail "k-fold trial 0:"$'\n'"$OUTPUT"
expect 0 "^study s-5 CANCELLED" opt cancel s-5 --reason "not trained here"
opt status s-5 --json >"$TMP/s-5.json" || fail "status --json failed"
"$PYTHON" - "$TMP/s-5.json" <<'PY' || fail "k-fold trial 0 is not three fold jobs"
import json, sys
trial = json.load(open(sys.argv[1]))["trials"][0]
assert [f.get("fold", 0) for f in trial["folds"]] == [0, 1, 2], trial
assert all(f["job_id"] for f in trial["folds"]), trial
PY
echo "ok: k-fold example"

# --- Nothing above disturbed the master. -------------------------------------
kill -0 "$MASTER_PID" 2>/dev/null || fail "mpilearn-master died"
echo "PASS"
