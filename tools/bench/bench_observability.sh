#!/usr/bin/env bash
# bench_observability: what metrics and tracing cost training throughput.
#
#   bazel run //tools:bench_observability -- [--json] [--train N] [--epochs E]
#                                            [--ranks R] [--repeats K]
#
# In one run, three masters serve the same job, interleaved K times:
#   off:           no metrics endpoint, no traces, no progress line;
#   metrics:       the metrics endpoint scraped every second (15x
#                  Prometheus' default rate) and the worker's progress line;
#   metrics_trace: as metrics, plus --trace on the master and on every rank.
# Each run is a downpour group of R ranks (every batch is one push, the
# most metric and trace events per sample of any algorithm). Reported:
#   ratio_metrics_vs_off       = samples/s with metrics / samples/s off
#   ratio_metrics_trace_vs_off = samples/s with metrics and traces / off
set -euo pipefail

json=false
train=20000
epochs=1
ranks=2
repeats=3
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=true ;;
    --train) train=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --ranks) ranks=$2; shift ;;
    --repeats) repeats=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "bench_observability: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

lib="${RUNFILES_DIR:-$0.runfiles}/mpilearn/tools/bench/bench_lib.sh"
[ -f "$lib" ] || lib="$(cd "$(dirname "$0")" && pwd)/bench_lib.sh"
# shellcheck source=tools/bench/bench_lib.sh
source "$lib"
bench_init bench_observability

cat > "$work/spec.json" <<JSON
{"name": "bench-observability", "model": {"name": "mlp"},
 "data": {"train_images": "$data/train-images-idx3-ubyte.gz",
          "train_labels": "$data/train-labels-idx1-ubyte.gz",
          "train_limit": $((train + 2000)), "validation_count": 2000},
 "algorithm": "downpour", "epochs": $epochs, "batch_size": 64, "seed": 1}
JSON

bench_start_master --metrics_listen=
master_off=$master
bench_start_master
master_metrics=$master; port_metrics=$metrics_port
bench_start_master --trace "$work/master.trace.json"
master_trace=$master; port_trace=$metrics_port
[ -n "$port_metrics" ] && [ -n "$port_trace" ] || {
  echo "bench_observability: a master did not report its metrics port" >&2; exit 1; }

# Scrapes both metrics endpoints every second (bash's /dev/tcp: no curl
# needed) and counts the bytes served.
scraper() {
  while true; do
    for port in "$port_metrics" "$port_trace"; do
      if exec 3<>"/dev/tcp/127.0.0.1/$port"; then
        printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
        cat <&3 >>"$work/scrapes.txt"
        exec 3<&-
      fi
    done
    sleep 1
  done
}
scraper &
bench_pids+=("$!")

run() {  # run NAME MASTER [WORKER FLAGS...] -> prints samples/s
  local name=$1 address=$2; shift 2
  mpirun "${mpi_flags[@]}" -np "$ranks" "$worker_bin" --master "$address" \
    --job "$work/spec.json" --threads 1 --summary_json "$work/$name.out" "$@" \
    >"$work/$name.log" 2>&1 \
    || { echo "bench_observability: run $name failed:" >&2; tail -5 "$work/$name.log" >&2; exit 1; }
  bench_field "$(cat "$work/$name.out")" samples_per_s
}

# Warm-up (not reported): first runs pay for page faults and channel set-up.
run warmup "$master_off" --progress=off >/dev/null

off_sum=0; metrics_sum=0; trace_sum=0
for i in $(seq 1 "$repeats"); do
  off=$(run "off-$i" "$master_off" --progress=off)
  metrics=$(run "metrics-$i" "$master_metrics" --progress=plain --progress_interval_s=1)
  traced=$(run "trace-$i" "$master_trace" --progress=plain --progress_interval_s=1 \
    --trace "$work/group-$i.trace.json")
  off_sum=$(bench_add "$off_sum" "$off")
  metrics_sum=$(bench_add "$metrics_sum" "$metrics")
  trace_sum=$(bench_add "$trace_sum" "$traced")
  $json || echo "  repeat $i: off $off, metrics $metrics, metrics+trace $traced samples/s" >&2
done

mean() { awk -v s="$1" -v n="$repeats" 'BEGIN{printf "%.1f", s/n}'; }
ratio_metrics=$(bench_ratio "$metrics_sum" "$off_sum")
ratio_trace=$(bench_ratio "$trace_sum" "$off_sum")
scrapes=$(grep -c '^HTTP/1' "$work/scrapes.txt" || true)
group_trace_bytes=$(stat -c %s "$work/group-1.trace.json")
group_trace_events=$(grep -c '"ph":"X"' "$work/group-1.trace.json" || true)

if $json; then
  printf '{"machine": {"cores": %d}, "train_samples": %d, "epochs": %d, "ranks": %d, "repeats": %d, "samples_per_s_off": %s, "samples_per_s_metrics": %s, "samples_per_s_metrics_trace": %s, "ratio_metrics_vs_off": %s, "ratio_metrics_trace_vs_off": %s, "scrapes": %d, "group_trace_events_per_run": %d, "group_trace_bytes_per_run": %d}\n' \
    "$(nproc)" "$train" "$epochs" "$ranks" "$repeats" "$(mean "$off_sum")" \
    "$(mean "$metrics_sum")" "$(mean "$trace_sum")" "$ratio_metrics" "$ratio_trace" \
    "$scrapes" "$group_trace_events" "$group_trace_bytes"
else
  echo "training samples/s, observability off:   $(mean "$off_sum")"
  echo "with metrics scraped every 1 s:           $(mean "$metrics_sum")  (ratio $ratio_metrics)"
  echo "with metrics and traces:                  $(mean "$trace_sum")  (ratio $ratio_trace)"
  echo "scrapes served: $scrapes; a group trace: $group_trace_events events, $group_trace_bytes bytes"
fi
