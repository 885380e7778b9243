#!/usr/bin/env bash
# bench_scaling: training throughput of the local baseline (one process, the
# master's optimizer in-process, no RPC) against real groups (a real master,
# mpirun with 1 and 2 ranks) for each algorithm, measured in one run, with
# the share of step time spent on data, compute, the master and MPI.
#
#   bazel run //tools:bench_scaling -- [--json] [--train N] [--epochs E]
#                                      [--algorithms "downpour sync easgd gem"]
#
# Each configuration trains the default MLP on a Fashion-MNIST subset with
# one compute thread per rank. speedup = samples/s / local baseline samples/s.
set -euo pipefail

json=false
train=20000
epochs=1
algorithms="downpour sync easgd gem"
ranks_list="1 2"
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=true ;;
    --train) train=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --algorithms) algorithms=$2; shift ;;
    --ranks) ranks_list=$2; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench_scaling: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

lib="${RUNFILES_DIR:-$0.runfiles}/mpilearn/tools/bench_lib.sh"
[ -f "$lib" ] || lib="$(cd "$(dirname "$0")" && pwd)/bench_lib.sh"
# shellcheck source=tools/bench_lib.sh
source "$lib"
bench_init bench_scaling

spec() {  # spec ALGORITHM FILE
  cat > "$2" <<JSON
{"name": "bench-$1", "model": {"name": "mlp"},
 "data": {"train_images": "$data/train-images-idx3-ubyte.gz",
          "train_labels": "$data/train-labels-idx1-ubyte.gz",
          "train_limit": $((train + 2000)), "validation_count": 2000},
 "algorithm": "$1", "epochs": $epochs, "batch_size": 64, "seed": 1}
JSON
}

bench_start_master

results=()
run() {  # run MODE RANKS
  local mode=$1 ranks=$2 out="$work/$1-$2.json"
  spec "$([ "$mode" = local ] && echo sync || echo "$mode")" "$work/spec-$mode.json"
  if [ "$mode" = local ]; then
    "$worker_bin" --local --job "$work/spec-$mode.json" --threads 1 \
      --local_state_dir "$work/local" --summary_json "$out" >"$work/$mode.log" 2>&1
  else
    mpirun "${mpi_flags[@]}" -np "$ranks" "$worker_bin" --master "$master" \
      --job "$work/spec-$mode.json" --threads 1 --summary_json "$out" \
      >"$work/$mode-$ranks.log" 2>&1
  fi || { echo "bench_scaling: $mode with $ranks rank(s) failed:" >&2;
          tail -5 "$work/$mode-$ranks.log" "$work/$mode.log" 2>/dev/null >&2; exit 1; }
  results+=("$(cat "$out")")
  $json || echo "  measured $mode, $ranks rank(s)" >&2
}

# Warm-up (not reported): the master's first job pays for page faults and
# channel set-up that later runs do not.
spec sync "$work/spec-warmup.json"
mpirun "${mpi_flags[@]}" -np 1 "$worker_bin" --master "$master" \
  --job "$work/spec-warmup.json" --threads 1 >"$work/warmup.log" 2>&1 \
  || { echo "bench_scaling: warm-up run failed:" >&2; tail -5 "$work/warmup.log" >&2; exit 1; }

run local 1
for algorithm in $algorithms; do
  for ranks in $ranks_list; do run "$algorithm" "$ranks"; done
done

# Numbers out of the summaries (flat keys are unique enough to grep).
field() { bench_field "$@"; }
mode_of() { sed -E 's/.*"mode": "([a-z]+)".*/\1/' <<<"$1"; }
base=$(field "${results[0]}" samples_per_s)

if $json; then
  rows=()
  for r in "${results[@]}"; do
    speedup=$(awk -v a="$(field "$r" samples_per_s)" -v b="$base" 'BEGIN{printf "%.4f", a/b}')
    rows+=("${r%\}}, \"speedup_vs_local\": $speedup}")
  done
  printf '{"machine": {"cores": %d, "train_samples": %d, "epochs": %d}, "results": [%s]}\n' \
    "$(nproc)" "$train" "$epochs" "$(IFS=,; echo "${rows[*]}")"
  exit 0
fi

printf '%-9s %5s %12s %9s %8s %6s %8s %7s %6s\n' mode ranks samples/s epoch_s speedup data compute master mpi
for r in "${results[@]}"; do
  awk -v mode="$(mode_of "$r")" -v ranks="$(field "$r" ranks)" \
      -v sps="$(field "$r" samples_per_s)" -v ep="$(field "$r" epoch_s)" -v base="$base" \
      -v d="$(field "$r" data)" -v c="$(field "$r" compute)" \
      -v m="$(field "$r" master)" -v p="$(field "$r" mpi)" \
      'BEGIN{printf "%-9s %5d %12.0f %9.2f %7.2fx %5.0f%% %7.0f%% %6.0f%% %5.0f%%\n",
             mode, ranks, sps, ep, sps/base, 100*d, 100*c, 100*m, 100*p}'
done
