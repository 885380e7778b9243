#!/usr/bin/env bash
# chaos: one real training job under a scripted schedule of SIGKILLs, against
# an undisturbed run of the same spec and seed.
#
#   bazel build -c opt //tools:chaos
#   bazel-out/k8-opt/bin/tools/soak/chaos [--json] [--keep] [--repeats R]
#       [--model cnn|mlp] [--algorithm sync|downpour] [--epochs E]
#       [--train_limit N] [--checkpoint_every_seconds S] [--group_timeout_s T]
#       [--timeout_s T] [--stall_s S]
#
# Both runs train Fashion-MNIST (Debian's dataset-fashion-mnist) on a fresh
# mpilearn-master (--group_timeout_s 10, see below) with a validation pool (mpirun -np 1
# --role validate, in-band validation off) and training groups of 2 ranks
# started by a loop that acts as the cluster's scheduler: while the job has
# not ended, run `mpirun -np 2 mpilearn-worker --job_id JOB`. Default job:
# the small CNN (channels 32,64, dense 128), sync, 4 epochs of 55,000 images,
# checkpoint.every_seconds 2: about 70 s undisturbed on 2 idle cores (3 to 6
# minutes while other builds share them).
#
# The chaos run kills, at points of the job's progress read from
# `mpilearnctl status --json` (samples trained / (samples per epoch x epochs)):
#   15%  rank:   SIGKILL rank 1 of the training group; mpirun ends, the loop
#                starts a new group; the master declares the old one lost;
#   35%  group:  SIGKILL mpirun and its ranks at once; same;
#   50%  pool:   SIGKILL the pool (mpirun and its rank); the script restarts it;
#   65%  master: SIGKILL the master, restart it on the same --state_dir and
#                port; the group and the pool reconnect by themselves.
# Each step waits for the previous recovery. Checks (PASS/FAIL with figures):
# the job ends COMPLETED; |test accuracy - baseline's| <= 0.01; every
# checkpoint (final ones, and a copy of checkpoints/ taken right after the
# master was killed) reads back through mpilearn-export (CRC-checked), no
# *.corrupt file, no "skipping checkpoint", and a master restarted on the final
# state directory loads the job COMPLETED at its final version; updates lost
# at the master kill <= the updates applied in one checkpoint interval
# (every_seconds plus one reaper tick, at the rate measured just before the
# kill), and the resumed version >= the checkpoint version reported before the
# kill; no master log shows a crash, and the last masters exit 0 on SIGTERM.
#
# --group_timeout_s: a group makes no call between RegisterGroup and
# InitWeights while it loads the data and builds the model (over 5 s on 2
# busy cores), and a group declared lost in that window hangs (rank 0 waits
# in MPI_Allgather after registering again, rank 1 has left; a worker bug),
# so the default is 10 rather than 5. A job whose version has not moved for
# --stall_s (default 120) is reported stuck instead of waited for.
#
# --json prints one JSON object on stdout (progress lines go to stderr in
# both modes); --repeats R runs R baselines with the same seed (the spread of
# undisturbed runs); --keep keeps the work directory (logs, state dirs).
# Exit status: 0 all checks pass, 1 a check failed, 2 usage error.
# shellcheck disable=SC2016  # the checks pass expressions to b, which evals them
set -uo pipefail

json=false
keep=false
repeats=1
model=cnn
algorithm=sync
epochs=4
train_limit=0
ckpt_seconds=2
group_timeout=10
timeout_s=900
stall_s=120
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=true ;;
    --keep) keep=true ;;
    --repeats) repeats=$2; shift ;;
    --model) model=$2; shift ;;
    --algorithm) algorithm=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --train_limit) train_limit=$2; shift ;;
    --checkpoint_every_seconds) ckpt_seconds=$2; shift ;;
    --group_timeout_s) group_timeout=$2; shift ;;
    --timeout_s) timeout_s=$2; shift ;;
    --stall_s) stall_s=$2; shift ;;
    -h|--help) sed -n '2,/^# shellcheck/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "chaos: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$model" in cnn|mlp) ;; *) echo "chaos: --model is cnn or mlp" >&2; exit 2 ;; esac
case "$algorithm" in sync|downpour) ;; *) echo "chaos: --algorithm is sync or downpour" >&2; exit 2 ;; esac
for n in "$repeats" "$epochs" "$train_limit" "$ckpt_seconds" "$group_timeout" "$timeout_s" "$stall_s"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "chaos: '$n' is not a whole number" >&2; exit 2; }
done
(( repeats >= 1 && epochs >= 1 && ckpt_seconds >= 1 && group_timeout >= 1 )) ||
  { echo "chaos: --repeats, --epochs, --checkpoint_every_seconds and --group_timeout_s must be >= 1" >&2; exit 2; }

runfiles=${RUNFILES_DIR:-$0.runfiles}
bin_dir="$runfiles/mpilearn"
[ -x "$bin_dir/worker/mpilearn-worker" ] || bin_dir="$(cd "$(dirname "$0")/../.." && pwd)"
master_bin="$bin_dir/server/mpilearn-master"
worker_bin="$bin_dir/worker/mpilearn-worker"
ctl_bin="$bin_dir/tools/cli/mpilearnctl"
export_bin="$bin_dir/tools/cli/mpilearn-export"
for b in "$master_bin" "$worker_bin" "$ctl_bin" "$export_bin"; do
  [ -x "$b" ] || { echo "chaos: missing $b (bazel build -c opt //tools:chaos)" >&2; exit 1; }
done
python=/usr/bin/python3
[ -x "$python" ] || { echo "chaos: needs /usr/bin/python3 (to read the status JSON)" >&2; exit 1; }
data=/usr/share/datasets/fashion-mnist
[ -f "$data/train-images-idx3-ubyte.gz" ] || {
  echo "chaos: needs Debian's dataset-fashion-mnist (tools/install_deps.sh)" >&2; exit 1; }
mpi_flags=(--oversubscribe --bind-to none)
[ "$(id -u)" -ne 0 ] || mpi_flags+=(--allow-run-as-root)
# A lost group is noticed at the first reaper tick after --group_timeout_s;
# the same tick writes timed checkpoints (server/core/master_core.cc).
tick_s=$(awk -v t="$group_timeout" 'BEGIN{print (t / 4 < 1) ? t / 4 : 1}')

work=$(mktemp -d -t mpilearn-chaos.XXXXXX)
t_start=$(date +%s.%N)

# ---------------------------------------------------------------------------
# Processes. Every process this script starts is recorded here by pid; on
# exit each one still running is ended (SIGTERM, then SIGKILL for it and the
# descendants it had), and nothing else.
started_pids=()      # masters, pools' mpirun, the group loop
cur_master_pid=""
cur_pool_pid=""
loop_pid=""
cur_run=""           # this run's directory (its group.pid file)

descendants() {  # descendants PID: every process under PID, one a line
  ps -eo pid=,ppid= | awk -v root="$1" '
    { parent[$1] = $2 }
    END { inset[root] = 1; changed = 1
          while (changed) { changed = 0
            for (p in parent) if (!(p in inset) && (parent[p] in inset)) { inset[p] = 1; changed = 1 } }
          for (p in inset) if (p != root) print p }'
}

stop_pid() {  # stop_pid PID: SIGTERM it, wait up to 10 s, then SIGKILL it and its descendants
  local pid=$1 below _
  kill -0 "$pid" 2>/dev/null || return 0
  below=$(descendants "$pid")
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  # shellcheck disable=SC2086
  [ -n "$below" ] && kill -KILL $below 2>/dev/null
  wait "$pid" 2>/dev/null
  return 0
}

stop_group_loop() {
  local gpid
  [ -n "$cur_run" ] && touch "$cur_run/stop"
  [ -n "$loop_pid" ] && stop_pid "$loop_pid"
  if [ -n "$cur_run" ] && [ -s "$cur_run/group.pid" ]; then
    gpid=$(cat "$cur_run/group.pid")
    # The loop's mpirun: only if it is still the one the loop started.
    grep -q mpirun "/proc/$gpid/cmdline" 2>/dev/null && stop_pid "$gpid"
  fi
  loop_pid=""
}

cleanup() {
  local i
  stop_group_loop
  for (( i=${#started_pids[@]}-1; i>=0; i-- )); do stop_pid "${started_pids[$i]}"; done
  if $keep; then echo "chaos: work directory kept: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() {
  printf 'chaos [%6.1fs] %s\n' "$(awk -v a="$(date +%s.%N)" -v b="$t_start" 'BEGIN{print a-b}')" "$*" >&2
}
now() { date +%s.%N; }
since() { awk -v a="$(date +%s.%N)" -v b="$1" 'BEGIN{printf "%.2f", a-b}'; }
die() { say "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------------------
# The job, and reading its status.
write_spec() {  # write_spec FILE
  local model_json limit=""
  if [ "$model" = cnn ]; then
    model_json='{"name": "cnn", "channels": [32, 64], "dense": 128}'
  else
    model_json='{"name": "mlp", "hidden": [256, 128]}'
  fi
  (( train_limit > 0 )) && limit="\"train_limit\": $train_limit,"
  cat > "$1" <<JSON
{"name": "chaos-$model-$algorithm", "model": $model_json,
 "data": {"train_images": "$data/train-images-idx3-ubyte.gz",
          "train_labels": "$data/train-labels-idx1-ubyte.gz",
          "test_images": "$data/t10k-images-idx3-ubyte.gz",
          "test_labels": "$data/t10k-labels-idx1-ubyte.gz",
          $limit "validation_count": 5000},
 "optimizer": {"name": "adam", "learning_rate": 0.001},
 "algorithm": "$algorithm", "epochs": $epochs, "batch_size": 64, "seed": 1,
 "inband_validation": false,
 "snapshots": {"every_updates": 100, "at_epoch_end": true},
 "checkpoint": {"every_seconds": $ckpt_seconds, "keep": 3, "best_metric": "val_loss"}}
JSON
}

# Reads one JobStatus JSON on stdin and prints shell assignments S_*;
# argv[1] is the validation source whose newest record version goes into
# S_poolval (-1 if none).
cat > "$work/status.py" <<'PY'
import json, sys
try:
    s = json.load(sys.stdin)
except ValueError:
    print("S_ok=0"); sys.exit(0)
groups = s.get("groups", [])
vals = s.get("validations", [])
spe = int(s.get("samples_per_epoch", 0))
epochs = int(s.get("spec", {}).get("epochs", 1))
done = int(s.get("samples_trained", 0))
frac = done / float(spe * epochs) if spe > 0 else 0.0
pool = [int(v.get("version", 0)) for v in vals if v.get("source") == sys.argv[1]]
print("S_ok=1")
print("S_state=%s" % s.get("state", "").replace("JOB_STATE_", ""))
print("S_version=%d" % int(s.get("version", 0)))
print("S_updates=%d" % int(s.get("updates_applied", 0)))
print("S_ckv=%d" % int(s.get("checkpoint_version", 0)))
print("S_frac=%.4f" % frac)
print("S_alive='%s'" % " ".join(g["group_id"] for g in groups if g.get("alive")))
print("S_groups='%s'" % " ".join(g["group_id"] for g in groups))
print("S_poolval=%d" % (max(pool) if pool else -1))
print("S_acc=%s" % (repr(s["test_accuracy"]) if "test_accuracy" in s else ""))
print("S_requeued=%d" % int(s.get("units_requeued", 0)))
print("S_message=%s" % json.dumps(s.get("message", "")).replace("'", "")[:200].replace('"', "'"))
PY

# The fields poll sets (through eval of status.py's output).
S_ok=0; S_state=""; S_version=0; S_updates=0; S_ckv=0; S_frac=0
S_alive=""; S_groups=""; S_poolval=-1; S_acc=""; S_requeued=0; S_message=""
master=""        # 127.0.0.1:PORT
job=""
pool_source=""   # "pool LABEL" of the current pool
poll() {  # poll: sets S_* from the job's status; returns 1 if the master did not answer
  local out
  S_ok=0
  out=$("$ctl_bin" --master "$master" status "$job" --json --connect_timeout_s 3 \
        --rpc_timeout_s 10 2>/dev/null) || return 1
  eval "$("$python" "$work/status.py" "$pool_source" <<<"$out")"
  [ "$S_ok" = 1 ]
}
# Progress watch: note_progress after each poll; stalled succeeds once the
# job's version has not changed for --stall_s seconds.
last_version=-1
last_change=0
note_progress() {
  if [ "$S_ok" = 1 ] && [ "$S_version" != "$last_version" ]; then
    last_version=$S_version; last_change=$(date +%s)
  fi
}
reset_progress() { last_version=-1; last_change=$(date +%s); }
stalled() { (( $(date +%s) - last_change > stall_s )); }
stall_report() {  # stall_report: what the stuck job and its last group show
  local last
  last="$cur_run/group-$(wc -l <"$cur_run/group.starts" 2>/dev/null).log"
  echo "no progress for ${stall_s} s: state ${S_state:-?}, version ${S_version:-?}, groups alive '${S_alive}', message '${S_message}'; last lines of ${last#"$work"/}: $(tail -3 "$last" 2>/dev/null | tr '\n' '|' | cut -c1-400)"
}
ended() { case "${S_state:-}" in COMPLETED|FAILED|CANCELLED) return 0 ;; esac; return 1; }

start_master() {  # start_master RUN LOG [PORT]: sets master, cur_master_pid
  local run=$1 log=$2 port=${3:-0} _
  rm -f "$run/port"
  "$master_bin" --listen "127.0.0.1:$port" --port_file "$run/port" --state_dir "$run/state" \
    --metrics_listen= --group_timeout_s "$group_timeout" 2>"$run/$log" &
  cur_master_pid=$!
  started_pids+=("$cur_master_pid")
  for _ in $(seq 1 300); do
    [ -s "$run/port" ] && break
    kill -0 "$cur_master_pid" 2>/dev/null || { tail -5 "$run/$log" >&2; die "the master did not start"; }
    sleep 0.1
  done
  [ -s "$run/port" ] || die "the master wrote no port file in 30 s"
  master="127.0.0.1:$(cat "$run/port")"
}

pool_count=0
start_pool() {  # start_pool RUN: a 1-rank validation pool of the job; sets cur_pool_pid
  local run=$1 label _
  pool_count=$((pool_count + 1))
  label="chaos-pool-$pool_count"
  pool_source="pool $label"
  mpirun "${mpi_flags[@]}" -np 1 "$worker_bin" --master "$master" --role validate \
    --jobs "$job" --threads 1 --pool_label "$label" --reconnect_timeout_s 120 \
    >"$run/pool-$pool_count.log" 2>&1 &
  cur_pool_pid=$!
  started_pids+=("$cur_pool_pid")
  # It sees only the snapshots published after it subscribed.
  for _ in $(seq 1 600); do
    grep -q 'waiting for snapshots' "$run/pool-$pool_count.log" 2>/dev/null && return 0
    kill -0 "$cur_pool_pid" 2>/dev/null || die "pool $label ended: $(tail -3 "$run/pool-$pool_count.log")"
    sleep 0.1
  done
  die "pool $label did not subscribe in 60 s"
}

# The scheduler: while the job has not ended, run a training group. Runs in
# the background; each group's mpirun pid is in RUN/group.pid, each start a
# line of RUN/group.starts.
group_loop() {  # group_loop RUN
  local run=$1 n=0 rc gpid _ out state
  while [ ! -e "$run/stop" ] && (( n < 30 )); do
    n=$((n + 1))
    mpirun "${mpi_flags[@]}" -np 2 "$worker_bin" --master "$master" --job_id "$job" \
      --threads 1 --reconnect_timeout_s 120 --progress plain --progress_interval_s 10 \
      >"$run/group-$n.log" 2>&1 &
    gpid=$!
    echo "$gpid" >"$run/group.pid"
    echo "$n $gpid $(date +%s.%N)" >>"$run/group.starts"
    wait "$gpid"; rc=$?
    echo "$n $rc $(date +%s.%N)" >>"$run/group.ends"
    # Ended? Ask until the master answers (it may be restarting).
    state=""
    for _ in $(seq 1 120); do
      [ -e "$run/stop" ] && return 0
      if out=$("$ctl_bin" --master "$master" status "$job" --json --connect_timeout_s 2 2>/dev/null); then
        state=$(grep -o '"state": "JOB_STATE_[A-Z]*"' <<<"$out" | head -1)
        break
      fi
      sleep 1
    done
    case "$state" in *COMPLETED*|*FAILED*|*CANCELLED*) return 0 ;; esac
    sleep 0.5
  done
}

start_group_loop() {  # start_group_loop RUN
  group_loop "$1" 2>"$1/group_loop.err" &
  loop_pid=$!
  started_pids+=("$loop_pid")
}

wait_end() {  # wait_end DEADLINE_EPOCH: polls until the job ended; 1 on timeout
  while :; do
    if poll; then
      ended && return 0
      note_progress
      stalled && { failures+=("$(stall_report)"); return 1; }
    fi
    awk -v n="$(date +%s)" -v d="$1" 'BEGIN{exit !(n > d)}' && return 1
    sleep 0.5
  done
}

crash_lines() {  # crash_lines LOG...: lines that show a crash (glog FATAL, CHECK, signals)
  grep -h -E '^F[0-9]{8} |Check failed|terminate called|\*\*\* (SIG|Aborted)|Segmentation fault|AddressSanitizer|stack trace' "$@" 2>/dev/null
}

# ---------------------------------------------------------------------------
# A run: fresh master, the job submitted, the pool, the group loop.
setup_run() {  # setup_run NAME: sets cur_run, master, job; starts everything
  cur_run="$work/$1"
  mkdir -p "$cur_run"
  write_spec "$cur_run/spec.json"
  start_master "$cur_run" master-1.log
  job=$("$ctl_bin" --master "$master" submit "$cur_run/spec.json" 2>"$cur_run/submit.err") ||
    die "submit failed: $(cat "$cur_run/submit.err")"
  start_pool "$cur_run"
  run_t0=$(now)
  reset_progress
  start_group_loop "$cur_run"
  say "$1: master $master (pid $cur_master_pid), $job, pool and group loop started"
}

finish_run() {  # finish_run: stops the loop, the pool and the master (SIGTERM); sets master_exit
  stop_group_loop
  [ -n "$cur_pool_pid" ] && stop_pid "$cur_pool_pid"
  cur_pool_pid=""
  master_exit=0
  if kill -0 "$cur_master_pid" 2>/dev/null; then
    kill -TERM "$cur_master_pid"
    wait "$cur_master_pid"; master_exit=$?
  fi
}

# ---------------------------------------------------------------------------
# Baselines.
base_accs=()
base_secs=()
base_crash=0
base_exit_bad=0
for r in $(seq 1 "$repeats"); do
  setup_run "baseline-$r"
  last_say=0
  while :; do
    if poll; then
      ended && break
      note_progress
      stalled && die "baseline-$r: $(stall_report)"
      if (( $(date +%s) - last_say >= 10 )); then
        say "baseline-$r: $S_state ${S_frac} of the job, version $S_version, checkpoint $S_ckv"
        last_say=$(date +%s)
      fi
    fi
    awk -v n="$(now)" -v t="$run_t0" -v m="$timeout_s" 'BEGIN{exit !(n - t > m)}' &&
      die "baseline-$r: the job did not end in $timeout_s s (state ${S_state:-?}); logs in $cur_run"
    sleep 0.5
  done
  secs=$(since "$run_t0")
  [ "$S_state" = COMPLETED ] || die "baseline-$r: the job ended $S_state: $S_message"
  [ -n "$S_acc" ] || { sleep 2; poll; }
  [ -n "$S_acc" ] || die "baseline-$r: COMPLETED without a test accuracy"
  base_accs+=("$S_acc")
  base_secs+=("$secs")
  finish_run
  (( master_exit == 0 )) || base_exit_bad=$((base_exit_bad + 1))
  n=$(crash_lines "$cur_run"/master-*.log | wc -l)
  base_crash=$((base_crash + n))
  say "baseline-$r: COMPLETED in ${secs} s, test_accuracy $S_acc, version $S_version"
done
baseline_accuracy=$(printf '%s\n' "${base_accs[@]}" | awk '{s += $1} END {printf "%.6f", s / NR}')
baseline_seconds=$(printf '%s\n' "${base_secs[@]}" | awk '{s += $1} END {printf "%.2f", s / NR}')
base_acc_min=$(printf '%s\n' "${base_accs[@]}" | sort -g | head -1)
base_acc_max=$(printf '%s\n' "${base_accs[@]}" | sort -g | tail -1)

# ---------------------------------------------------------------------------
# The chaos run.
setup_run chaos
run=$cur_run
kills_json=()
failures=()

wait_progress() {  # wait_progress FRACTION: polls until the job passed it; 1 if it ended first
  local last=0
  while :; do
    if poll; then
      ended && return 1
      note_progress
      stalled && { failures+=("$(stall_report)"); return 1; }
      awk -v f="$S_frac" -v p="$1" 'BEGIN{exit !(f >= p)}' && return 0
      if (( $(date +%s) - last >= 10 )); then
        say "chaos: $S_state ${S_frac} of the job, version $S_version, checkpoint $S_ckv (next kill at $1)"
        last=$(date +%s)
      fi
    fi
    awk -v n="$(now)" -v t="$run_t0" -v m="$timeout_s" 'BEGIN{exit !(n - t > m)}' && return 1
    sleep 0.3
  done
}

rank_of() {  # rank_of PID: its MPI rank (from its environment), or empty
  tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'
}

# kill_group rank|group: kills rank 1 of the current group, or the group's
# mpirun and ranks at once; waits until the master declared the group lost
# (detected) and a new group trained (recovered).
kill_group() {
  local what=$1 gpid ranks victim="" p victim_group known at_version at_updates t0
  local detected="" recovered="" deadline
  # The current group: its 2 ranks running under mpirun, and registered.
  for _ in $(seq 1 100); do
    gpid=$(cat "$run/group.pid")
    ranks=""
    for p in $(descendants "$gpid"); do
      grep -q mpilearn-worker "/proc/$p/cmdline" 2>/dev/null && ranks="$ranks $p"
    done
    poll && [ -n "$S_alive" ] && [ "$(wc -w <<<"$ranks")" -ge 2 ] && break
    sleep 0.3
  done
  [ -n "$ranks" ] || { failures+=("$what kill: no worker rank under mpirun $gpid"); return 1; }
  for p in $ranks; do [ "$(rank_of "$p")" = 1 ] && victim=$p; done
  [ -n "$victim" ] || victim=${ranks##* }
  poll || true
  victim_group=${S_alive##* }
  known=$S_groups
  at_version=$S_version
  at_updates=$S_updates
  at_frac=$S_frac
  t0=$(now)
  if [ "$what" = rank ]; then
    kill -KILL "$victim"
    say "chaos: SIGKILL rank 1 (pid $victim) of group $victim_group at version $at_version"
  else
    # shellcheck disable=SC2086
    kill -KILL "$gpid" $ranks
    say "chaos: SIGKILL group $victim_group (mpirun $gpid, ranks$ranks) at version $at_version"
  fi
  deadline=$(( $(date +%s) + 90 ))
  while [ -z "$detected" ] || [ -z "$recovered" ]; do
    if poll; then
      ended && break
      if [ -z "$detected" ] && [[ " $S_alive " != *" $victim_group "* ]]; then
        detected=$(since "$t0"); say "chaos: the master declared $victim_group lost after $detected s"
      fi
      if [ -z "$recovered" ] && (( S_updates > at_updates )); then
        for p in $S_alive; do
          if [[ " $known " != *" $p "* ]]; then
            recovered=$(since "$t0"); say "chaos: new group $p training after $recovered s"; break
          fi
        done
      fi
    fi
    (( $(date +%s) > deadline )) && break
    sleep 0.3
  done
  [ -n "$detected" ] || failures+=("$what kill: group $victim_group not declared lost within 90 s")
  [ -n "$recovered" ] || failures+=("$what kill: no new group trained within 90 s")
  kills_json+=("{\"what\": \"$what\", \"at_progress\": $at_frac, \"at_version\": $at_version, \"group\": \"$victim_group\", \"detected_seconds\": ${detected:-null}, \"recovered_seconds\": ${recovered:-null}}")
}

kill_pool() {
  local below at_version t0 recovered="" restarted deadline
  below=$(descendants "$cur_pool_pid")
  poll || true
  at_version=$S_version; at_frac=$S_frac
  t0=$(now)
  # shellcheck disable=SC2086
  kill -KILL "$cur_pool_pid" $below
  wait "$cur_pool_pid" 2>/dev/null
  say "chaos: SIGKILL the validation pool (mpirun $cur_pool_pid, rank $below) at version $at_version"
  start_pool "$run"
  restarted=$(since "$t0")
  say "chaos: pool restarted as '$pool_source' after $restarted s"
  deadline=$(( $(date +%s) + 90 ))
  while [ -z "$recovered" ]; do
    if poll; then
      ended && break
      (( S_poolval >= 0 )) && { recovered=$(since "$t0"); say "chaos: '$pool_source' reported a validation (version $S_poolval) after $recovered s"; }
    fi
    (( $(date +%s) > deadline )) && break
    sleep 0.3
  done
  [ -n "$recovered" ] || failures+=("pool kill: the new pool reported no validation within 90 s")
  kills_json+=("{\"what\": \"pool\", \"at_progress\": $at_frac, \"at_version\": $at_version, \"restarted_seconds\": $restarted, \"recovered_seconds\": ${recovered:-null}}")
}

lost_updates=null
interval_updates=null
rate=null
resumed_version=null
ckv_before=null
kill_master() {
  local v1 t1 v2 t2 port t0 restart_s recovered="" pool_back="" starts_before starts_after deadline line
  poll || true; v1=$S_updates; t1=$(now)
  sleep 2
  poll || true; v2=$S_updates; t2=$(now)
  rate=$(awk -v a="$v1" -v b="$v2" -v s="$t1" -v e="$t2" 'BEGIN{printf "%.1f", (b - a) / (e - s)}')
  at_version=$S_version; ckv_before=$S_ckv; at_frac=$S_frac
  starts_before=$(wc -l <"$run/group.starts")
  port=${master##*:}
  t0=$(now)
  kill -KILL "$cur_master_pid"
  wait "$cur_master_pid" 2>/dev/null
  say "chaos: SIGKILL the master (pid $cur_master_pid) at version $at_version (checkpoint $ckv_before, $rate updates/s)"
  # What the killed master left on disk, to read back later.
  cp -a "$run/state/jobs/$job/checkpoints" "$run/checkpoints-at-master-kill"
  start_master "$run" master-2.log "$port"
  restart_s=$(since "$t0")
  line=$(grep -m1 "job $job loaded from" "$run/master-2.log")
  resumed_version=$(sed -nE 's/.*, version ([0-9]+),.*/\1/p' <<<"$line")
  [ -n "$resumed_version" ] || { failures+=("master kill: no 'loaded from' line for $job in master-2.log"); resumed_version=null; }
  say "chaos: master restarted on port $port after $restart_s s: ${line#*] }"
  if [ "$resumed_version" != null ]; then
    lost_updates=$(( at_version > resumed_version ? at_version - resumed_version : 0 ))
  fi
  interval_updates=$(awk -v r="$rate" -v s="$ckpt_seconds" -v k="$tick_s" \
    'BEGIN{x = r * (s + k); printf "%d", (x == int(x)) ? x : int(x) + 1}')
  deadline=$(( $(date +%s) + 150 ))
  while [ -z "$recovered" ] || [ -z "$pool_back" ]; do
    if poll; then
      ended && break
      if [ -z "$recovered" ] && [ -n "$S_alive" ] && (( S_version > ${resumed_version/null/0} )); then
        recovered=$(since "$t0"); say "chaos: training again after $recovered s (groups $S_alive, version $S_version)"
      fi
      if [ -z "$pool_back" ] && [ "$resumed_version" != null ] && (( S_poolval > resumed_version )); then
        pool_back=$(since "$t0"); say "chaos: the pool reported a validation (version $S_poolval) to the new master after $pool_back s"
      fi
    fi
    (( $(date +%s) > deadline )) && break
    sleep 0.3
  done
  starts_after=$(wc -l <"$run/group.starts")
  [ -n "$recovered" ] || failures+=("master kill: training did not resume within 150 s")
  # The pool's own word that it subscribed to the new master (its retries
  # back off, so a short job may end before its next validation).
  pool_resubscribed=false
  grep -q 'subscribed again' "$run/pool-$pool_count.log" && pool_resubscribed=true
  if [ -z "$pool_back" ] && ! { ended && $pool_resubscribed; }; then
    failures+=("master kill: the pool reported no validation to the restarted master within 150 s")
  fi
  kills_json+=("{\"what\": \"master\", \"at_progress\": $at_frac, \"at_version\": $at_version, \"checkpoint_version_before\": $ckv_before, \"resumed_version\": $resumed_version, \"restart_seconds\": $restart_s, \"recovered_seconds\": ${recovered:-null}, \"pool_recovered_seconds\": ${pool_back:-null}, \"pool_resubscribed\": $pool_resubscribed, \"groups_started_by_loop\": $((starts_after - starts_before))}")
}

schedule=("0.15 rank" "0.35 group" "0.50 pool" "0.65 master")
for step in "${schedule[@]}"; do
  read -r at what <<<"$step"
  if ! wait_progress "$at"; then
    failures+=("$what kill: the job ended or timed out before ${at} of it (state ${S_state:-?})")
    break
  fi
  case "$what" in
    rank|group) kill_group "$what" ;;
    pool) kill_pool ;;
    master) kill_master ;;
  esac
done

deadline=$(awk -v t="$run_t0" -v m="$timeout_s" 'BEGIN{printf "%d", t + m}')
say "chaos: schedule done; waiting for the job to end"
if wait_end "$deadline"; then
  chaos_seconds=$(since "$run_t0")
  chaos_state=$S_state
  [ -n "$S_acc" ] || { sleep 2; poll; }
else
  chaos_seconds=$(since "$run_t0")
  chaos_state="${S_state:-unknown} (stuck or timed out)"
fi
chaos_accuracy=${S_acc:-null}
final_version=$S_version
chaos_message=$S_message
units_requeued=$S_requeued
groups_started=$(wc -l <"$run/group.starts")
say "chaos: $chaos_state after $chaos_seconds s, test_accuracy $chaos_accuracy, version $final_version, $groups_started group(s) started"
finish_run
chaos_master_exit=$master_exit

# ---------------------------------------------------------------------------
# Checkpoints: every one read back through mpilearn-export (CRC-checked).
mkdir -p "$run/verify"
ckpt_files=()
for f in "$run/state/jobs/$job"/checkpoints/*.pb "$run/state/jobs/$job/weights.pb" \
         "$run"/checkpoints-at-master-kill/*.pb; do
  [ -f "$f" ] && ckpt_files+=("$f")
done
verified=0
unreadable=()
for f in "${ckpt_files[@]}"; do
  if "$export_bin" --state_dir "$run/state" --job_id "$job" --weights "$f" --format tensors \
       --out "$run/verify/out.pt" >"$run/verify/export.log" 2>&1; then
    verified=$((verified + 1))
  else
    unreadable+=("${f#"$run"/}: $(tail -1 "$run/verify/export.log")")
  fi
done
corrupt_files=$(find "$run/state" "$run"/checkpoints-at-master-kill -name '*.corrupt' 2>/dev/null | wc -l)
skipped=$(cat "$run"/master-*.log 2>/dev/null | grep -c 'skipping checkpoint')
corrupt_checkpoints=$(( ${#unreadable[@]} + corrupt_files + skipped ))
say "checkpoints: $verified of ${#ckpt_files[@]} read back; $corrupt_files *.corrupt, $skipped 'skipping checkpoint' lines"

# A master restarted on the final state directory loads the job as it ended.
start_master "$run" master-final.log
reload_ok=false
reload_line=$(grep -m1 "job $job loaded from" "$run/master-final.log")
if poll; then
  if [ "$S_state" = COMPLETED ] && [ "$S_version" = "$final_version" ] && [ "$S_acc" = "$chaos_accuracy" ]; then
    reload_ok=true
  fi
fi
reload_state="$S_state version $S_version test_accuracy ${S_acc:-none}"
kill -TERM "$cur_master_pid"; wait "$cur_master_pid"; final_master_exit=$?
say "reload: ${reload_line#*] }"

master_crash=$(crash_lines "$run"/master-*.log | wc -l)
master_crash=$((master_crash + base_crash))

# ---------------------------------------------------------------------------
# Checks.
pass=true
check() {  # check NAME OK DETAIL
  local mark=PASS
  if [ "$2" != true ]; then mark=FAIL; pass=false; fi
  $json || printf '%s  %-34s %s\n' "$mark" "$1" "$3"
  checks_json+=("\"$1\": $2")
}
checks_json=()
b() { if eval "$1"; then echo true; else echo false; fi; }

accuracy_gap=null
[ "$chaos_accuracy" != null ] && accuracy_gap=$(awk -v a="$chaos_accuracy" -v b="$baseline_accuracy" \
  'BEGIN{d = a - b; if (d < 0) d = -d; printf "%.4f", d}')
$json || {
  echo
  echo "chaos run: $model, $algorithm, $epochs epochs, 2 ranks + 1-rank pool, checkpoint.every_seconds $ckpt_seconds, --group_timeout_s $group_timeout"
  echo "baseline(s): test_accuracy ${base_accs[*]} (mean $baseline_accuracy), seconds ${base_secs[*]}"
  echo "chaos:       test_accuracy $chaos_accuracy in $chaos_seconds s, $groups_started group(s) started"
  for k in "${kills_json[@]}"; do echo "  kill: $k"; done
  for f in "${failures[@]}"; do echo "  problem: $f"; done
  for u in "${unreadable[@]}"; do echo "  unreadable: $u"; done
  echo
}
check completed "$(b '[ "$chaos_state" = COMPLETED ]')" "state $chaos_state ${chaos_message:+($chaos_message)}"
check accuracy_within_1_point "$(b '[ "$accuracy_gap" != null ] && awk -v g="$accuracy_gap" "BEGIN{exit !(g <= 0.01)}"')" \
  "|$chaos_accuracy - $baseline_accuracy| = $accuracy_gap (baselines from $base_acc_min to $base_acc_max)"
check schedule_recovered "$(b '[ ${#failures[@]} -eq 0 ]')" "${#kills_json[@]} of 4 kills done, ${#failures[@]} problem(s)"
check checkpoints_read_back "$(b '[ $corrupt_checkpoints -eq 0 ] && [ $verified -gt 0 ]')" \
  "$verified of ${#ckpt_files[@]} files verified, $corrupt_files *.corrupt, $skipped skipped at load"
check reload_completed_at_final_version "$reload_ok" "restarted master: $reload_state (expected COMPLETED version $final_version)"
check updates_lost_within_interval "$(b '[ "$lost_updates" != null ] && (( lost_updates <= interval_updates )) && (( resumed_version >= ckv_before ))')" \
  "lost $lost_updates (version $at_version -> $resumed_version) <= $interval_updates = ceil($rate updates/s x ($ckpt_seconds s + $tick_s s tick)); resumed >= checkpoint $ckv_before"
check master_no_crash "$(b '[ $master_crash -eq 0 ] && [ $chaos_master_exit -eq 0 ] && [ $final_master_exit -eq 0 ] && [ $base_exit_bad -eq 0 ]')" \
  "$master_crash crash lines; SIGTERM exits: chaos master $chaos_master_exit, reloaded $final_master_exit"

if $json; then
  acc_list=$(IFS=,; echo "${base_accs[*]}")
  sec_list=$(IFS=,; echo "${base_secs[*]}")
  kill_list=$(IFS=,; echo "${kills_json[*]}")
  check_list=$(IFS=,; echo "${checks_json[*]}")
  prob_list=""
  for f in "${failures[@]}" "${unreadable[@]}"; do
    prob_list+="${prob_list:+, }$("$python" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$f")"
  done
  printf '{"model": "%s", "algorithm": "%s", "epochs": %d, "ranks": 2, "group_timeout_s": %d, "baseline_accuracy": %s, "baseline_accuracies": [%s], "baseline_seconds": %s, "baseline_seconds_each": [%s], "chaos_accuracy": %s, "accuracy_gap": %s, "chaos_seconds": %s, "chaos_state": "%s", "groups_started": %d, "units_requeued": %d, "kills": [%s], "updates_lost_at_master_kill": %s, "checkpoint_interval_seconds": %d, "checkpoint_interval_updates": %s, "updates_per_second_at_master_kill": %s, "checkpoints_verified": %d, "corrupt_checkpoints": %d, "master_crash_lines": %d, "checks": {%s}, "problems": [%s], "pass": %s}\n' \
    "$model" "$algorithm" "$epochs" "$group_timeout" "$baseline_accuracy" "$acc_list" "$baseline_seconds" "$sec_list" \
    "$chaos_accuracy" "$accuracy_gap" "$chaos_seconds" "$chaos_state" "$groups_started" "$units_requeued" "$kill_list" \
    "$lost_updates" "$ckpt_seconds" "$interval_updates" "$rate" "$verified" "$corrupt_checkpoints" "$master_crash" \
    "$check_list" "$prob_list" "$pass"
else
  $pass && echo "chaos: PASS" || echo "chaos: FAIL"
fi
$pass
