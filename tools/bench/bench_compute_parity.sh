#!/usr/bin/env bash
# bench_compute_parity: the local baseline (mpilearn-worker --local: one
# process, the master's optimizer in-process, no RPC) against a plain
# PyTorch training loop of the same model (tools/bench/bench_torch_peer.py
# --ranks 1, Debian's /usr/bin/python3 with python3-torch, the LibTorch the
# worker links), same data, batch, Adam and thread count, in one run.
#
#   bazel run -c opt //tools:bench_compute_parity -- [--json] [--model cnn|mlp]
#       [--train N] [--rounds R] [--threads T] [--other_worker PATH] [--cpu]
#
# Each round runs both once, in alternating order (the machine is shared and
# its load drifts); ratio = worker samples/s / PyTorch samples/s of that
# round. Samples/s of both count the training loop only (batches, forward,
# loss, backward, optimizer step), not start-up, data loading or validation.
# PyTorch runs with OMP_NUM_THREADS and OPENBLAS_NUM_THREADS = --threads, as
# the worker sets its pools: Debian's pthread OpenBLAS otherwise adds a
# thread per core that torch.set_num_threads does not limit.
# --other_worker times a second worker binary in the same rounds (say, the
# build before a change) as a third column.
# --cpu: samples per CPU-second instead (user + system time of the process,
# which other processes on the machine disturb far less than wall time):
# each program runs at --train and at --train / 5 samples, and the
# difference of CPU time over the difference of samples cancels start-up,
# data loading and the evaluation after training.
set -euo pipefail

json=false
model=cnn
train=12800
rounds=3
threads=1
other=""
cpu=false
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=true ;;
    --model) model=$2; shift ;;
    --train) train=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --threads) threads=$2; shift ;;
    --other_worker) other=$2; shift ;;
    --cpu) cpu=true ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "bench_compute_parity: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

lib="${RUNFILES_DIR:-$0.runfiles}/mpilearn/tools/bench/bench_lib.sh"
[ -f "$lib" ] || lib="$(cd "$(dirname "$0")" && pwd)/bench_lib.sh"
# shellcheck source=tools/bench/bench_lib.sh
source "$lib"
bench_init bench_compute_parity
peer="$bin_dir/tools/bench/bench_torch_peer.py"
[ -f "$peer" ] || peer="$(cd "$(dirname "$0")" && pwd)/bench_torch_peer.py"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "bench_compute_parity: needs Debian's python3-torch (/usr/bin/python3)" >&2
  exit 1
}

small=$((train / 5))
for n in "$train" "$small"; do
  cat > "$work/spec-$n.json" <<JSON
{"name": "parity-$model", "model": {"name": "$model"},
 "data": {"train_images": "$data/train-images-idx3-ubyte.gz",
          "train_labels": "$data/train-labels-idx1-ubyte.gz",
          "train_limit": $((n + 2000)), "validation_count": 2000},
 "algorithm": "sync", "epochs": 1, "batch_size": 64, "seed": 1}
JSON
done

# cpu_seconds FILE: user + system seconds that /usr/bin/time wrote.
cpu_seconds() { awk '{s = $1 + $2} END {print s}' "$1"; }

worker_run() {  # worker_run BINARY TAG SAMPLES: one local run
  rm -rf "$work/state"
  /usr/bin/time -f "%U %S" -o "$work/$2.time" \
    "$1" --local --job "$work/spec-$3.json" --threads "$threads" \
    --local_state_dir "$work/state" --summary_json "$work/$2.json" >"$work/$2.log" 2>&1 \
    || { echo "bench_compute_parity: $1 failed:" >&2; tail -5 "$work/$2.log" >&2; exit 1; }
}

torch_run() {  # torch_run SAMPLES: one PyTorch run
  OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" \
    /usr/bin/time -f "%U %S" -o "$work/torch.time" \
    /usr/bin/python3 "$peer" --model "$model" --train "$1" --ranks 1 --batch 64 \
    >"$work/torch.json" 2>"$work/torch.log" \
    || { echo "bench_compute_parity: the PyTorch loop failed:" >&2; tail -5 "$work/torch.log" >&2; exit 1; }
}

# Samples/s of the training loop, or (--cpu) training samples per CPU-second.
worker_sps() {  # worker_sps BINARY TAG
  worker_run "$1" "$2" "$train"
  if ! $cpu; then bench_field "$(cat "$work/$2.json")" samples_per_s; return; fi
  local big
  big=$(cpu_seconds "$work/$2.time")
  worker_run "$1" "$2" "$small"
  awk -v a="$big" -v b="$(cpu_seconds "$work/$2.time")" -v n=$((train - small)) \
    'BEGIN{printf "%.3f", n / (a - b)}'
}

torch_sps() {
  torch_run "$train"
  if ! $cpu; then bench_field "$(cat "$work/torch.json")" samples_per_s; return; fi
  local big
  big=$(cpu_seconds "$work/torch.time")
  torch_run "$small"
  awk -v a="$big" -v b="$(cpu_seconds "$work/torch.time")" -v n=$((train - small)) \
    'BEGIN{printf "%.3f", n / (a - b)}'
}

rows=()
for round in $(seq 1 "$rounds"); do
  w="" t="" o=""
  if [ $((round % 2)) -eq 1 ]; then
    w=$(worker_sps "$worker_bin" worker); t=$(torch_sps)
    [ -z "$other" ] || o=$(worker_sps "$other" other)
  else
    [ -z "$other" ] || o=$(worker_sps "$other" other)
    t=$(torch_sps); w=$(worker_sps "$worker_bin" worker)
  fi
  rows+=("$round $w $t ${o:-0}")
  $json || echo "  round $round measured" >&2
done

if $json; then
  items=()
  for r in "${rows[@]}"; do
    read -r round w t o <<<"$r"
    item="{\"round\": $round, \"worker_samples_per_s\": $w, \"torch_samples_per_s\": $t, \"ratio\": $(bench_ratio "$w" "$t")"
    [ -z "$other" ] || item+=", \"other_samples_per_s\": $o, \"other_ratio\": $(bench_ratio "$o" "$t")"
    items+=("$item}")
  done
  printf '{"model": "%s", "train": %d, "threads": %d, "batch_size": 64, "measure": "%s", "rounds": [%s]}\n' \
    "$model" "$train" "$threads" "$($cpu && echo cpu || echo wall)" "$(IFS=,; echo "${items[*]}")"
  exit 0
fi

$cpu && echo "samples per CPU-second of training (--cpu)"
if [ -z "$other" ]; then
  printf '%-6s %14s %14s %7s\n' round worker/s torch/s ratio
else
  printf '%-6s %14s %14s %7s %14s %7s\n' round worker/s torch/s ratio other/s ratio
fi
for r in "${rows[@]}"; do
  read -r round w t o <<<"$r"
  if [ -z "$other" ]; then
    printf '%-6s %14.0f %14.0f %6.3fx\n' "$round" "$w" "$t" "$(bench_ratio "$w" "$t")"
  else
    printf '%-6s %14.0f %14.0f %6.3fx %14.0f %6.3fx\n' "$round" "$w" "$t" \
      "$(bench_ratio "$w" "$t")" "$o" "$(bench_ratio "$o" "$t")"
  fi
done
