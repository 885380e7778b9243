#!/usr/bin/env bash
# bench_validation: what a validation pool costs training, and what it saves.
#
#   bazel run //tools:bench_validation -- [--json] [--train N] [--epochs E] [--repeats R]
#
# In one run, on a real master:
#   off:    a training group with validation off (no pool, no in-band);
#   pool:   the same group while a validation pool (`--role validate`)
#           validates snapshots published every 50 updates and at epoch ends;
#   inband: the same group validating in-band at each epoch end (no pool).
# The training group and the master run on core 0 and the pool on core 1
# (taskset), as they would on separate nodes of a cluster. Reported:
#   throughput_ratio_pool_vs_off = samples/s with the pool / samples/s off,
#                                 the median over --repeats pairs (default 5)
#   inband_validation_share     = in-band validation time / run time, the
#                                 share of a run the pool takes off the group.
set -euo pipefail

json=false
train=20000
epochs=2
repeats=5
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=true ;;
    --train) train=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --repeats) repeats=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "bench_validation: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

lib="${RUNFILES_DIR:-$0.runfiles}/mpilearn/tools/bench/bench_lib.sh"
[ -f "$lib" ] || lib="$(cd "$(dirname "$0")" && pwd)/bench_lib.sh"
# shellcheck source=tools/bench/bench_lib.sh
source "$lib"
bench_init bench_validation
mpi_flags+=(--bind-to none)
cores=$(nproc)
train_cpu=0
pool_cpu=$(( cores > 1 ? 1 : 0 ))

spec() {  # spec FILE INBAND SNAPSHOT_EVERY
  cat > "$1" <<JSON
{"name": "bench-validation", "model": {"name": "mlp"},
 "data": {"train_images": "$data/train-images-idx3-ubyte.gz",
          "train_labels": "$data/train-labels-idx1-ubyte.gz",
          "train_limit": $((train + 5000)), "validation_count": 5000},
 "algorithm": "sync", "epochs": $epochs, "batch_size": 64, "seed": 1,
 "inband_validation": $2,
 "snapshots": {"every_updates": $3, "at_epoch_end": $([ "$3" -gt 0 ] && echo true || echo false)}}
JSON
}

bench_start_master --cpu "$train_cpu"

train_run() {  # train_run NAME INBAND SNAPSHOT_EVERY -> prints the summary JSON
  spec "$work/$1.json" "$2" "$3"
  taskset -c "$train_cpu" mpirun "${mpi_flags[@]}" -np 1 "$worker_bin" --master "$master" \
    --job "$work/$1.json" --threads 1 --summary_json "$work/$1.out" >"$work/$1.log" 2>&1 \
    || { echo "bench_validation: run $1 failed:" >&2; tail -5 "$work/$1.log" >&2; exit 1; }
  cat "$work/$1.out"
}
field() { bench_field "$@"; }

# The pool follows every job on the master; it idles between runs.
taskset -c "$pool_cpu" mpirun "${mpi_flags[@]}" -np 1 "$worker_bin" --master "$master" \
  --role validate --threads 1 >"$work/pool.log" 2>&1 &
bench_pids+=("$!")

# Runs of a few seconds on a shared machine drift (other processes, CPU
# frequency): each repeat is a pair run back to back, in alternating order
# (off then pool, pool then off, ...), so a drift in time cancels between
# pairs, and the figure reported is the median of the pairs' ratios.
off_sum=0; pool_sum=0; pair_ratios=()
for i in $(seq 1 "$repeats"); do
  if (( i % 2 == 1 )); then
    off=$(train_run "off-$i" false 0)
    with_pool=$(train_run "pool-$i" false 50)
  else
    with_pool=$(train_run "pool-$i" false 50)
    off=$(train_run "off-$i" false 0)
  fi
  off_sps=$(field "$off" samples_per_s)
  pool_sps=$(field "$with_pool" samples_per_s)
  off_sum=$(bench_add "$off_sum" "$off_sps")
  pool_sum=$(bench_add "$pool_sum" "$pool_sps")
  pair_ratios+=("$(bench_ratio "$pool_sps" "$off_sps")")
  $json || echo "  repeat $i: off $off_sps samples/s, with pool $pool_sps samples/s, ratio ${pair_ratios[-1]}" >&2
done
inband=$(train_run inband true 0)
validated=$(grep -c '^validated ' "$work/pool.log" || true)

sorted=($(printf '%s\n' "${pair_ratios[@]}" | sort -g))
n=${#sorted[@]}
if (( n % 2 == 1 )); then
  ratio=${sorted[$((n / 2))]}
else
  ratio=$(awk -v a="${sorted[$((n / 2 - 1))]}" -v b="${sorted[$((n / 2))]}" 'BEGIN{printf "%.4f", (a+b)/2}')
fi
ratio_min=${sorted[0]}
ratio_max=${sorted[$((n - 1))]}
ratio_of_means=$(bench_ratio "$pool_sum" "$off_sum")
share=$(awk -v v="$(field "$inband" validation_s)" -v t="$(field "$inband" total_s)" \
  'BEGIN{printf "%.4f", v/t}')
off_mean=$(awk -v s="$off_sum" -v n="$repeats" 'BEGIN{printf "%.1f", s/n}')
pool_mean=$(awk -v s="$pool_sum" -v n="$repeats" 'BEGIN{printf "%.1f", s/n}')

if $json; then
  printf '{"machine": {"cores": %d, "train_cpu": %d, "pool_cpu": %d}, "train_samples": %d, "epochs": %d, "repeats": %d, "samples_per_s_off": %s, "samples_per_s_with_pool": %s, "throughput_ratio_pool_vs_off": %s, "pair_ratio_min": %s, "pair_ratio_max": %s, "ratio_of_means": %s, "inband_validation_share": %s, "inband_validation_s": %s, "inband_total_s": %s, "pool_validations": %d}\n' \
    "$cores" "$train_cpu" "$pool_cpu" "$train" "$epochs" "$repeats" "$off_mean" "$pool_mean" \
    "$ratio" "$ratio_min" "$ratio_max" "$ratio_of_means" "$share" "$(field "$inband" validation_s)" "$(field "$inband" total_s)" "$validated"
else
  echo "training samples/s, validation off:        $off_mean"
  echo "training samples/s, pool validating:       $pool_mean  (pool validated $validated snapshots)"
  echo "throughput ratio pool vs off:               $ratio  (median of $repeats pairs; target >= 0.95)"
  echo "  pairs' ratios from $ratio_min to $ratio_max; ratio of the means $ratio_of_means"
  echo "in-band validation share of a run:          $share  (time the pool takes off the group)"
fi
