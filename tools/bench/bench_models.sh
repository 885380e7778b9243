#!/usr/bin/env bash
# bench_models: what a user's TorchScript model costs against the same
# architecture built in, and where the step time of the zoo's larger
# examples goes.
#
#   bazel run //tools:bench_models -- [--json] [--train N] [--image_train N]
#                                     [--epochs E] [--repeats R]
#
# In one run, on a real master with mpirun groups (algorithm sync, batch 64,
# one compute thread per rank, validation off):
#   mlp:    the built-in "mlp" (hidden [256, 128]) and the same layers
#           exported from docs/examples/models/mlp.py by
#           tools/cli/export_torchscript.py, on --train Fashion-MNIST samples,
#           with 1 and 2 ranks;
#   cnn_bn: the built-in "cnn" with batch_norm and dropout 0.25 and
#           docs/examples/models/cnn_bn.py, the same layers (conv 32 and 64
#           + BN + ReLU + pool, dense 128 + BN + ReLU, dropout, out; 422,090
#           parameters both), on --image_train samples, 1 and 2 ranks;
#   gru, cifar_cnn: 2 ranks, once each, on //tools/data:make_synthetic_data's
#           `sequences` (--train samples) and `images32` (--image_train).
# Each pairing runs --repeats times, built-in and TorchScript alternated;
# the median samples/s is reported and
#   torchscript_vs_builtin_{1rank,2ranks} = TorchScript / built-in (goal >= 0.9).
# Step-time shares (data, compute, master, mpi) are the worker's
# --summary_json `share` fields.
set -euo pipefail

json=false
train=10000
image_train=3000
epochs=1
repeats=3
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=true ;;
    --train) train=$2; shift ;;
    --image_train) image_train=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --repeats) repeats=$2; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "bench_models: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

lib="${RUNFILES_DIR:-$0.runfiles}/mpilearn/tools/bench/bench_lib.sh"
[ -f "$lib" ] || lib="$(cd "$(dirname "$0")" && pwd)/bench_lib.sh"
# shellcheck source=tools/bench/bench_lib.sh
source "$lib"
bench_init bench_models

# The export helper and the model files are data of this target (or beside
# the sources); make_synthetic_data is in the runfiles only.
export_py="$bin_dir/tools/cli/export_torchscript.py"
models="$bin_dir/docs/examples/models"
synth_bin="$bin_dir/tools/data/make_synthetic_data"
[ -x "$synth_bin" ] || synth_bin="$bin_dir/bazel-bin/tools/data/make_synthetic_data"
python=/usr/bin/python3
"$python" -c 'import torch' 2>/dev/null || {
  echo "bench_models: needs python3-torch under $python (tools/install_deps.sh)" >&2
  exit 1
}
[ -x "$synth_bin" ] || { echo "bench_models: make_synthetic_data not built" >&2; exit 1; }

export_model() {  # export_model MODEL.py INPUT_SHAPE OUTPUTS OUT.pt [--param K=V]
  local file=$1 shape=$2 outputs=$3 out=$4; shift 4
  "$python" "$export_py" "$models/$file" --input_shape "$shape" --outputs "$outputs" \
    --seed 1 --out "$out" "$@" >"$out.log" 2>&1 \
    || { echo "bench_models: exporting $file failed:" >&2; cat "$out.log" >&2; exit 1; }
}
export_model mlp.py 1,28,28 10 "$work/mlp.pt"
export_model cnn_bn.py 1,28,28 10 "$work/cnn_bn.pt"

# Generated data: a few hundred extra samples for the validation split the
# loader holds out, and a token test split (no test_images in the specs).
"$synth_bin" --kind sequences --out_dir "$work/sequences" --train $((train + 500)) \
  --test 100 >"$work/synth-sequences.log" 2>&1 \
  || { echo "bench_models: make_synthetic_data failed:" >&2; cat "$work/synth-sequences.log" >&2; exit 1; }
"$synth_bin" --kind images32 --out_dir "$work/images32" --train $((image_train + 500)) \
  --test 100 >"$work/synth-images32.log" 2>&1 \
  || { echo "bench_models: make_synthetic_data failed:" >&2; cat "$work/synth-images32.log" >&2; exit 1; }

spec() {  # spec FILE MODEL_JSON FEATURES LABELS TRAIN
  cat > "$1" <<JSON
{"name": "bench-models", "model": $2,
 "data": {"train_images": "$3", "train_labels": "$4",
          "train_limit": $(($5 + 500)), "validation_count": 500},
 "algorithm": "sync", "epochs": $epochs, "batch_size": 64, "seed": 1,
 "inband_validation": false}
JSON
}
fmnist=("$data/train-images-idx3-ubyte.gz" "$data/train-labels-idx1-ubyte.gz")
sequences=("$work/sequences/train-features.idx.gz" "$work/sequences/train-labels.idx.gz")
images32=("$work/images32/train-features.idx.gz" "$work/images32/train-labels.idx.gz")

bench_start_master

run_job() {  # run_job NAME RANKS SPEC -> prints the summary JSON
  mpirun "${mpi_flags[@]}" -np "$2" "$worker_bin" --master "$master" \
    --job "$3" --threads 1 --summary_json "$work/$1.out" >"$work/$1.log" 2>&1 \
    || { echo "bench_models: run $1 failed:" >&2; tail -5 "$work/$1.log" >&2; exit 1; }
  $json || echo "  $1: $(bench_field "$(cat "$work/$1.out")" samples_per_s) samples/s" >&2
  cat "$work/$1.out"
}
field() { bench_field "$@"; }
median() { tr ' ' '\n' <<<"$*" | sort -g | awk '{v[NR]=$1} END{
  printf "%.1f", NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

spec "$work/mlp-builtin.json" '{"name": "mlp"}' "${fmnist[@]}" "$train"
spec "$work/mlp-torchscript.json" "{\"torchscript\": \"$work/mlp.pt\"}" "${fmnist[@]}" "$train"
spec "$work/cnn_bn-builtin.json" '{"name": "cnn", "batch_norm": true, "dropout": 0.25}' \
  "${fmnist[@]}" "$image_train"
spec "$work/cnn_bn-torchscript.json" "{\"torchscript\": \"$work/cnn_bn.pt\"}" \
  "${fmnist[@]}" "$image_train"
spec "$work/gru.json" '{"name": "gru", "recurrent": [64], "dense": 32}' \
  "${sequences[@]}" "$train"
spec "$work/cifar_cnn.json" \
  '{"name": "cnn", "channels": [32, 32, 64, 64], "pool_every": 2, "dense": 512, "dropout": 0.5}' \
  "${images32[@]}" "$image_train"

# Warm-up (not reported): the master's first job pays for page faults and
# channel set-up that later runs do not.
run_job warmup 1 "$work/mlp-builtin.json" >/dev/null

# pair MODEL RANKS: sets sps[MODEL-{builtin,torchscript}-RANKS], the medians
# of the repeats, and runs[...], every repeat's samples/s.
declare -A sps runs
pair() {
  local model=$1 ranks=$2 i b=() t=() out
  for i in $(seq 1 "$repeats"); do
    out=$(run_job "$model-builtin-$ranks-$i" "$ranks" "$work/$model-builtin.json")
    b+=("$(field "$out" samples_per_s)")
    out=$(run_job "$model-torchscript-$ranks-$i" "$ranks" "$work/$model-torchscript.json")
    t+=("$(field "$out" samples_per_s)")
  done
  sps[$model-builtin-$ranks]=$(median "${b[@]}")
  sps[$model-torchscript-$ranks]=$(median "${t[@]}")
  runs[$model-builtin-$ranks]=$(IFS=,; echo "${b[*]}" | sed "s/,/, /g")
  runs[$model-torchscript-$ranks]=$(IFS=,; echo "${t[*]}" | sed "s/,/, /g")
}
for model in mlp cnn_bn; do
  for ranks in 1 2; do pair "$model" "$ranks"; done
done
gru=$(run_job gru 2 "$work/gru.json")
cifar=$(run_job cifar_cnn 2 "$work/cifar_cnn.json")

ratio() { bench_ratio "${sps[$1-torchscript-$2]}" "${sps[$1-builtin-$2]}"; }
shares() {  # shares SUMMARY -> {"data": ..., "compute": ..., "master": ..., "mpi": ...}
  printf '{"data": %s, "compute": %s, "master": %s, "mpi": %s}' \
    "$(field "$1" data)" "$(field "$1" compute)" "$(field "$1" master)" "$(field "$1" mpi)"
}
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)

if $json; then
  pairs=""
  for model in mlp cnn_bn; do
    pairs+=$(printf '"%s": {"builtin_1rank": %s, "torchscript_1rank": %s, "builtin_2ranks": %s, "torchscript_2ranks": %s, "torchscript_vs_builtin_1rank": %s, "torchscript_vs_builtin_2ranks": %s, "runs": {"builtin_1rank": [%s], "torchscript_1rank": [%s], "builtin_2ranks": [%s], "torchscript_2ranks": [%s]}}, ' \
      "$model" "${sps[$model-builtin-1]}" "${sps[$model-torchscript-1]}" \
      "${sps[$model-builtin-2]}" "${sps[$model-torchscript-2]}" \
      "$(ratio "$model" 1)" "$(ratio "$model" 2)" \
      "${runs[$model-builtin-1]}" "${runs[$model-torchscript-1]}" \
      "${runs[$model-builtin-2]}" "${runs[$model-torchscript-2]}")
  done
  printf '{"machine": {"cores": %d, "cpu": "%s"}, "train_samples": %d, "image_train_samples": %d, "epochs": %d, "repeats": %d, %s"torchscript_vs_builtin_1rank": %s, "torchscript_vs_builtin_2ranks": %s, "gru_samples_per_s": %s, "gru_shares": %s, "cifar_cnn_samples_per_s": %s, "cifar_cnn_shares": %s}\n' \
    "$(nproc)" "$cpu" "$train" "$image_train" "$epochs" "$repeats" "$pairs" \
    "$(ratio mlp 1)" "$(ratio mlp 2)" \
    "$(field "$gru" samples_per_s)" "$(shares "$gru")" \
    "$(field "$cifar" samples_per_s)" "$(shares "$cifar")"
  exit 0
fi

echo "samples/s, median of $repeats (sync, batch 64, 1 thread per rank; $(nproc) cores, $cpu)"
printf '%-8s %5s %10s %12s %8s\n' model ranks built-in torchscript ratio
for model in mlp cnn_bn; do
  for ranks in 1 2; do
    printf '%-8s %5d %10.0f %12.0f %8s\n' "$model" "$ranks" \
      "${sps[$model-builtin-$ranks]}" "${sps[$model-torchscript-$ranks]}" "$(ratio "$model" "$ranks")"
  done
done
echo "goal: torchscript_vs_builtin >= 0.9 (mlp is the headline)"
echo
printf '%-10s %5s %10s %6s %8s %7s %6s\n' example ranks samples/s data compute master mpi
for name in gru cifar_cnn; do
  r=$([ "$name" = gru ] && echo "$gru" || echo "$cifar")
  awk -v n="$name" -v ranks="$(field "$r" ranks)" -v sps="$(field "$r" samples_per_s)" \
      -v d="$(field "$r" data)" -v c="$(field "$r" compute)" \
      -v m="$(field "$r" master)" -v p="$(field "$r" mpi)" \
      'BEGIN{printf "%-10s %5d %10.0f %5.0f%% %7.0f%% %6.0f%% %5.0f%%\n",
             n, ranks, sps, 100*d, 100*c, 100*m, 100*p}'
done
