# shellcheck shell=bash
# Shared set-up of the benchmark scripts (sourced by tools/bench/bench_*.sh,
# not run): finds the binaries in the Bazel runfiles (or next to the sources),
# checks for the data, makes a work directory, and on exit ends every process
# started with bench_start_master or registered in bench_pids, then removes
# the work directory.
#
#   source "${RUNFILES_DIR:-$0.runfiles}/mpilearn/tools/bench/bench_lib.sh"
#   bench_init bench_name
#   bench_start_master [--trace FILE ...]      # sets $master, $master_pid
#   mpirun "${mpi_flags[@]}" -np 2 "$worker_bin" --master "$master" ...
#   bench_field "$(cat summary.json)" samples_per_s

bench_init() {  # bench_init NAME
  bench_name=$1
  local runfiles=${RUNFILES_DIR:-$0.runfiles}
  bin_dir="$runfiles/mpilearn"
  [ -x "$bin_dir/worker/mpilearn-worker" ] || bin_dir="$(cd "$(dirname "$0")/../.." && pwd)"
  master_bin="$bin_dir/server/mpilearn-master"
  worker_bin="$bin_dir/worker/mpilearn-worker"
  data=/usr/share/datasets/fashion-mnist
  [ -f "$data/train-images-idx3-ubyte.gz" ] || {
    echo "$bench_name: needs Debian's dataset-fashion-mnist (tools/install_deps.sh)" >&2
    exit 1
  }
  work=$(mktemp -d -t "mpilearn-$bench_name.XXXXXX")
  bench_pids=()
  trap bench_cleanup EXIT
  mpi_flags=(--oversubscribe)
  [ "$(id -u)" -ne 0 ] || mpi_flags+=(--allow-run-as-root)
}

bench_cleanup() {
  local i pid
  for (( i=${#bench_pids[@]}-1; i>=0; i-- )); do
    pid=${bench_pids[$i]}
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
}

# bench_start_master [--cpu N] [MASTER FLAGS...]: starts mpilearn-master on
# free loopback ports (gRPC, and metrics unless the flags set
# --metrics_listen), optionally pinned to CPU N; sets $master (host:port),
# $master_pid, $master_log and $metrics_port (empty when metrics are off).
bench_start_master() {
  local prefix=()
  if [ "${1:-}" = --cpu ]; then prefix=(taskset -c "$2"); shift 2; fi
  local dir
  dir=$(mktemp -d "$work/master.XXXX")
  master_log="$dir/master.log"
  "${prefix[@]}" "$master_bin" --listen 127.0.0.1:0 --port_file "$dir/port" \
    --state_dir "$dir/state" --metrics_listen 127.0.0.1:0 \
    --metrics_port_file "$dir/metrics_port" "$@" 2>"$master_log" &
  master_pid=$!
  bench_pids+=("$master_pid")
  local _
  for _ in $(seq 1 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
  [ -s "$dir/port" ] || { echo "$bench_name: the master did not start:" >&2; cat "$master_log" >&2; exit 1; }
  master="127.0.0.1:$(cat "$dir/port")"
  metrics_port=""
  for _ in $(seq 1 20); do [ -s "$dir/metrics_port" ] && break; sleep 0.1; done
  [ -s "$dir/metrics_port" ] && metrics_port=$(cat "$dir/metrics_port")
  return 0
}

# bench_field JSON KEY: a number out of a flat JSON object (--summary_json).
bench_field() { sed -E "s/.*\"$2\": ([0-9.eE+-]+).*/\1/" <<<"$1"; }

# bench_mean SUM COUNT / bench_add A B: arithmetic on decimals.
bench_add() { awk -v a="$1" -v b="$2" 'BEGIN{print a+b}'; }
bench_ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.4f", a/b}'; }
