#!/usr/bin/env bash
# The main job, end to end, on a fresh Debian 12 machine:
#   1. installs the Debian packages running needs (tools/install_deps.sh
#      --run; the test packages stay with tools/test.sh) and builds the
#      binaries with Bazel;
#   2. starts mpilearn-master as a background service on free loopback ports
#      (gRPC, and Prometheus metrics);
#   3. runs `mpirun -np 2 mpilearn-worker --master localhost:PORT --job SPEC`
#      (default spec: docs/examples/fashion_mnist.json, Debian's Fashion-MNIST);
#   4. stops the master cleanly (SIGTERM) and prints test_accuracy=<value>
#      as the last line.
#
#   tools/quickstart.sh [SPEC.json]      NP=4 tools/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."

spec=${1:-docs/examples/fashion_mnist.json}
np=${NP:-2}
[ -f "$spec" ] || { echo "quickstart: no job spec at '$spec'" >&2; exit 2; }

tools/install_deps.sh --run
echo "quickstart: building (first build takes a few minutes)"
bazel build //server:mpilearn-master //worker:mpilearn-worker //tools:mpilearnctl
bin=$(bazel info bazel-bin 2>/dev/null)

state=${STATE_DIR:-$(mktemp -d -t mpilearn-quickstart.XXXXXX)}
mkdir -p "$state"
rm -f "$state/port"
rm -f "$state/metrics_port"
"$bin/server/mpilearn-master" --listen 127.0.0.1:0 --port_file "$state/port" \
  --metrics_listen 127.0.0.1:0 --metrics_port_file "$state/metrics_port" \
  --state_dir "$state" 2>"$state/master.log" &
master_pid=$!
stop_master() {
  if kill -0 "$master_pid" 2>/dev/null; then
    kill -TERM "$master_pid"
    wait "$master_pid" || true
  fi
}
trap stop_master EXIT

for _ in $(seq 1 100); do
  [ -s "$state/port" ] && break
  kill -0 "$master_pid" 2>/dev/null || { cat "$state/master.log" >&2; exit 1; }
  sleep 0.1
done
[ -s "$state/port" ] || { echo "quickstart: master did not start" >&2; exit 1; }
port=$(cat "$state/port")
echo "quickstart: mpilearn-master (pid $master_pid) on 127.0.0.1:$port, state in $state"
[ -s "$state/metrics_port" ] &&
  echo "quickstart: live metrics at http://127.0.0.1:$(cat "$state/metrics_port")/metrics"

mpi_flags=(-np "$np" --oversubscribe)
[ "$(id -u)" -ne 0 ] || mpi_flags+=(--allow-run-as-root)
start=$(date +%s)
mpirun "${mpi_flags[@]}" "$bin/worker/mpilearn-worker" \
  --master "127.0.0.1:$port" --job "$spec" 2>"$state/worker.err" | tee "$state/worker.log" \
  || { cat "$state/worker.err" >&2; exit 1; }
end=$(date +%s)

stop_master
trap - EXIT
echo "quickstart: master stopped cleanly; wall time $((end - start)) s; history in $state/jobs/"
result=$(grep '^test_accuracy=' "$state/worker.log" | tail -n 1)
[ -n "$result" ] || { echo "quickstart: no test_accuracy in the worker output" >&2; exit 1; }
echo "$result"
