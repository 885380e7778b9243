#!/usr/bin/env bash
# bench_scaling: training throughput and test accuracy of the local baseline
# (one process, the master's optimizer in-process, no RPC) against real
# groups (a real master, mpirun with 1 and 2 ranks) for each algorithm, and
# against the peer: the same model, data, batch and optimizer trained by a
# plain PyTorch loop (one process) and by PyTorch DistributedDataParallel
# (gloo, 2 processes on loopback), all measured in one run, for the MLP and
# the CNN; with the share of step time spent on data, compute, the master
# and MPI.
#
#   bazel run -c opt //tools:bench_scaling -- [--json | --json_file FILE]
#       [--models "mlp cnn"] [--train N] [--cnn_train N] [--epochs E]
#       [--ranks "1 2"] [--algorithms "downpour sync easgd gem"] [--no_peer]
#       [--seed S]
#
# Every configuration: Fashion-MNIST, the built-in model with its defaults,
# batch 64 per rank, Adam at the default rate, one compute thread per
# process, `--train` training samples for the MLP and `--cnn_train` for the
# CNN (about 10x the compute per sample), validation_count 2,000 held out,
# the 10,000-image test set evaluated after training. speedup =
# samples/s / the same model's local samples/s; wait = (master + MPI) share
# of the ranks' summed step time. The peer (tools/bench/bench_torch_peer.py) runs
# under /usr/bin/python3 (Debian's python3-torch); --no_peer leaves it out.
# Every run, the peer's included, uses the job seed S (default 1): the peer
# draws the same initial weights and trains in the same sample order (the
# epoch's permutation cut into the same data units), so the plain loop
# computes what the local baseline does and DDP what `sync` does with as
# many ranks, up to float rounding. Their test accuracies are a paired
# comparison (accuracy_gaps); across seeds the MLP's moves by about a point.
#
# --json prints one object instead of the table (--json_file writes it to
# FILE and prints the table too): "machine"; "results", the first model's
# rows as before (each summary plus "model" and "speedup_vs_local"); and
# "models", per model: train_samples, parameters (ours, from the master's
# JobStatus, and the peer's; the run fails if they differ), results, peer
# (the peer's objects), rows (samples_per_s and test_accuracy of local,
# <algorithm>_<R>, torch_plain, ddp_<R>), best_2rank, ratios
# (best_2rank_vs_local, best_2rank_vs_ddp, downpour_2_vs_ddp, sync_2_vs_ddp,
# local_vs_torch_plain; null where a row is missing) and wait_share
# (<algorithm>_2: master + MPI share of the 2 ranks' summed step time),
# accuracy_gaps (local_vs_torch_plain and sync_<R>_vs_ddp_<R>: our test
# accuracy minus the peer's, same seed and order; null where a row is
# missing).
set -euo pipefail

json=false
json_file=""
train=20000
# 4 data units of 2,048 samples: 2 per rank with 2 ranks.
cnn_train=8192
epochs=1
algorithms="downpour sync easgd gem"
ranks_list="1 2"
models="mlp cnn"
peer=true
seed=1
# The spec's default data_unit_size, set in the spec and given to the peer.
unit_size=2048
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=true ;;
    --json_file) json_file=$2; shift ;;
    --train) train=$2; shift ;;
    --cnn_train) cnn_train=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --algorithms) algorithms=$2; shift ;;
    --ranks) ranks_list=$2; shift ;;
    --models) models=$2; shift ;;
    --no_peer) peer=false ;;
    --seed) seed=$2; shift ;;
    -h|--help) sed -n '2,43p' "$0"; exit 0 ;;
    *) echo "bench_scaling: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "bench_scaling: --seed takes an integer >= 0, got '$seed'" >&2; exit 2; }
for model in $models; do
  case "$model" in
    mlp|cnn) ;;
    *) echo "bench_scaling: --models takes mlp and/or cnn, got '$model'" >&2; exit 2 ;;
  esac
done

lib="${RUNFILES_DIR:-$0.runfiles}/mpilearn/tools/bench/bench_lib.sh"
[ -f "$lib" ] || lib="$(cd "$(dirname "$0")" && pwd)/bench_lib.sh"
# shellcheck source=tools/bench/bench_lib.sh
source "$lib"
bench_init bench_scaling
ctl_bin="$bin_dir/tools/cli/mpilearnctl"
peer_py="$bin_dir/tools/bench/bench_torch_peer.py"
[ -f "$peer_py" ] || peer_py="$(dirname "$(readlink -f "$0")")/bench_torch_peer.py"
python=/usr/bin/python3
if $peer && ! "$python" -c 'import torch' 2>/dev/null; then
  echo "bench_scaling: $python has no torch (Debian's python3-torch); running without the peer" >&2
  peer=false
fi

# say WHAT: a progress line with the seconds since the last one.
last_said=$SECONDS
say() {
  $json || echo "  $* ($((SECONDS - last_said)) s)" >&2
  last_said=$SECONDS
}
samples_of() { if [ "$1" = cnn ]; then echo "$cnn_train"; else echo "$train"; fi; }

spec() {  # spec MODEL ALGORITHM FILE
  cat > "$3" <<JSON
{"name": "bench-$1-$2", "model": {"name": "$1"},
 "data": {"train_images": "$data/train-images-idx3-ubyte.gz",
          "train_labels": "$data/train-labels-idx1-ubyte.gz",
          "test_images": "$data/t10k-images-idx3-ubyte.gz",
          "test_labels": "$data/t10k-labels-idx1-ubyte.gz",
          "train_limit": $(($(samples_of "$1") + 2000)), "validation_count": 2000},
 "algorithm": "$2", "epochs": $epochs, "batch_size": 64, "seed": $seed,
 "data_unit_size": $unit_size}
JSON
}

bench_start_master

# summary["MODEL/MODE/RANKS"]: a run's one-line JSON (the worker's
# --summary_json, or the peer's object with mode torch_plain or ddp).
declare -A summary
declare -A parameters peer_parameters
ours=()  # MODEL/MODE/RANKS of our runs, in order

run() {  # run MODEL MODE RANKS
  local model=$1 mode=$2 ranks=$3 out="$work/$1-$2-$3.json" log="$work/$1-$2-$3.log"
  spec "$model" "$([ "$mode" = local ] && echo sync || echo "$mode")" "$work/spec-$model-$mode.json"
  if [ "$mode" = local ]; then
    "$worker_bin" --local --job "$work/spec-$model-$mode.json" --threads 1 \
      --local_state_dir "$work/local-$model" --summary_json "$out" >"$log" 2>&1
  else
    mpirun "${mpi_flags[@]}" -np "$ranks" "$worker_bin" --master "$master" \
      --job "$work/spec-$model-$mode.json" --threads 1 --summary_json "$out" >"$log" 2>&1
  fi || { echo "bench_scaling: $model $mode with $ranks rank(s) failed:" >&2
          tail -5 "$log" >&2; exit 1; }
  summary["$model/$mode/$ranks"]=$(cat "$out")
  ours+=("$model/$mode/$ranks")
  if [ "$mode" != local ] && [ -z "${parameters[$model]:-}" ]; then
    local job status
    job=$(sed -E 's/.*"job_id": "([^"]*)".*/\1/' <<<"${summary[$model/$mode/$ranks]}")
    status=$("$ctl_bin" --master "$master" status "$job" --json) \
      || { echo "bench_scaling: mpilearnctl status $job failed" >&2; exit 1; }
    parameters[$model]=$(tr -d '\n' <<<"$status" | sed -E 's/.*"parameters": "?([0-9]+)"?.*/\1/')
  fi
  say "measured $model $mode, $ranks rank(s)"
}

run_peer() {  # run_peer MODEL RANKS
  local model=$1 ranks=$2 mode out log="$work/$1-peer-$2.log"
  mode=$([ "$ranks" -eq 1 ] && echo torch_plain || echo ddp)
  out=$("$python" "$peer_py" --model "$model" --train "$(samples_of "$model")" \
        --validation_count 2000 --ranks "$ranks" --epochs "$epochs" --batch 64 \
        --lr 0.001 --seed "$seed" --data_unit_size "$unit_size" 2>"$log") \
    || { echo "bench_scaling: the PyTorch peer ($model, $mode, $ranks) failed:" >&2
         tail -5 "$log" >&2; exit 1; }
  summary["$model/$mode/$ranks"]=$out
  peer_parameters[$model]=$(bench_field "$out" parameters)
  say "measured $model $mode, $ranks process(es)"
}

# Warm-up (not reported): the master's first job pays for page faults and
# channel set-up that later runs do not.
spec mlp sync "$work/spec-warmup.json"
mpirun "${mpi_flags[@]}" -np 1 "$worker_bin" --master "$master" \
  --job "$work/spec-warmup.json" --threads 1 >"$work/warmup.log" 2>&1 \
  || { echo "bench_scaling: warm-up run failed:" >&2; tail -5 "$work/warmup.log" >&2; exit 1; }

for model in $models; do
  run "$model" local 1
  for algorithm in $algorithms; do
    for ranks in $ranks_list; do run "$model" "$algorithm" "$ranks"; done
  done
  if $peer; then
    run_peer "$model" 1
    for ranks in $ranks_list; do
      [ "$ranks" -gt 1 ] && run_peer "$model" "$ranks"
    done
    if [ -n "${parameters[$model]:-}" ] &&
       [ "${parameters[$model]}" != "${peer_parameters[$model]}" ]; then
      echo "bench_scaling: the $model has ${parameters[$model]} parameters here but" \
           "${peer_parameters[$model]} in the PyTorch peer; fix tools/bench/bench_torch_peer.py" >&2
      exit 1
    fi
  fi
done

# --- figures ---------------------------------------------------------------

field() { bench_field "$@"; }
mode_of() { sed -E 's/.*"mode": "([a-z_]+)".*/\1/' <<<"$1"; }
# sps_of KEY: samples/s of summary[KEY], or empty when that run is missing.
sps_of() { if [ -n "${summary[$1]:-}" ]; then field "${summary[$1]}" samples_per_s; fi; }
# ratio A B: A / B to 4 places, or null when either is missing.
ratio() {
  if [ -n "$1" ] && [ -n "$2" ]; then bench_ratio "$1" "$2"; else echo null; fi
}
or_null() { if [ -n "$1" ]; then echo "$1"; else echo null; fi; }
joined() { local IFS=,; echo "$*"; }
# acc_of KEY: test accuracy of summary[KEY], or empty when that run is missing.
acc_of() { if [ -n "${summary[$1]:-}" ]; then field "${summary[$1]}" test_accuracy; fi; }
# gap A B: A - B to 4 places, or null when either is missing.
gap() {
  if [ -n "$1" ] && [ -n "$2" ]; then
    awk -v a="$1" -v b="$2" 'BEGIN{printf "%.4f", a - b}'
  else
    echo null
  fi
}
# accuracy_gaps MODEL: the JSON members of MODEL's "accuracy_gaps" (ours
# minus the peer's run of the same computation: local against the plain
# loop, sync against DDP with as many ranks).
accuracy_gaps() {
  local ranks gaps=()
  gaps+=("\"local_vs_torch_plain\": $(gap "$(acc_of "$1/local/1")" "$(acc_of "$1/torch_plain/1")")")
  for ranks in $ranks_list; do
    [ "$ranks" -gt 1 ] || continue
    gaps+=("\"sync_${ranks}_vs_ddp_${ranks}\": $(gap "$(acc_of "$1/sync/$ranks")" "$(acc_of "$1/ddp/$ranks")")")
  done
  joined "${gaps[@]}"
}

# our_keys / peer_keys MODEL: the summary keys of MODEL's runs, in order.
our_keys() {
  local key
  for key in "${ours[@]}"; do [[ "$key" != "$1/"* ]] || echo "$key"; done
}
peer_keys() {
  local key ranks
  for key in "$1/torch_plain/1" $(for ranks in $ranks_list; do
                                    [ "$ranks" -le 1 ] || echo "$1/ddp/$ranks"; done); do
    [ -z "${summary[$key]:-}" ] || echo "$key"
  done
}
# row_name KEY: local, <algorithm>_<ranks>, torch_plain or ddp_<ranks>.
row_name() {
  local mode=${1#*/} ranks=${1##*/}
  mode=${mode%/*}
  case "$mode" in local|torch_plain) echo "$mode" ;; *) echo "${mode}_$ranks" ;; esac
}
# with_speedup MODEL KEY: summary[KEY] plus "model" and "speedup_vs_local".
with_speedup() {
  local r=${summary[$2]}
  echo "${r%\}}, \"model\": \"$1\", \"speedup_vs_local\": $(ratio "$(field "$r" samples_per_s)" "$(sps_of "$1/local/1")")}"
}
# best2 MODEL: "algorithm samples_per_s" of the fastest 2-rank group.
best2() {
  local algorithm sps best="" best_sps=""
  for algorithm in $algorithms; do
    sps=$(sps_of "$1/$algorithm/2")
    [ -n "$sps" ] || continue
    if [ -z "$best_sps" ] || awk -v a="$sps" -v b="$best_sps" 'BEGIN{exit !(a > b)}'; then
      best=$algorithm; best_sps=$sps
    fi
  done
  echo "$best $best_sps"
}
# ratios MODEL: "best best_vs_local best_vs_ddp downpour_vs_ddp sync_vs_ddp
# local_vs_torch" (null where a run is missing).
ratios() {
  local best best_sps base ddp
  read -r best best_sps <<<"$(best2 "$1")" || true
  base=$(sps_of "$1/local/1"); ddp=$(sps_of "$1/ddp/2")
  echo "${best:-null}" "$(ratio "$best_sps" "$base")" "$(ratio "$best_sps" "$ddp")" \
    "$(ratio "$(sps_of "$1/downpour/2")" "$ddp")" "$(ratio "$(sps_of "$1/sync/2")" "$ddp")" \
    "$(ratio "$base" "$(sps_of "$1/torch_plain/1")")"
}

# model_json MODEL: MODEL's entry of "models".
model_json() {
  local model=$1 key r results=() peers=() rows=() waits=()
  local best vs_local vs_ddp downpour_vs_ddp sync_vs_ddp local_vs_torch
  for key in $(our_keys "$model"); do
    r=${summary[$key]}
    results+=("$(with_speedup "$model" "$key")")
    if [ "${key##*/}" = 2 ]; then
      waits+=("\"$(row_name "$key")\": $(awk -v m="$(field "$r" master)" -v p="$(field "$r" mpi)" 'BEGIN{printf "%.4f", m+p}')")
    fi
  done
  for key in $(peer_keys "$model"); do peers+=("$(with_speedup "$model" "$key")"); done
  for key in $(our_keys "$model") $(peer_keys "$model"); do
    rows+=("\"$(row_name "$key")\": {\"samples_per_s\": $(field "${summary[$key]}" samples_per_s), \"test_accuracy\": $(field "${summary[$key]}" test_accuracy)}")
  done
  read -r best vs_local vs_ddp downpour_vs_ddp sync_vs_ddp local_vs_torch <<<"$(ratios "$model")"
  [ "$best" = null ] || best="\"$best\""
  printf '"%s": {"train_samples": %d, "parameters": %s, "peer_parameters": %s, ' \
    "$model" "$(samples_of "$model")" "$(or_null "${parameters[$model]:-}")" \
    "$(or_null "${peer_parameters[$model]:-}")"
  printf '"results": [%s], "peer": [%s], "rows": {%s}, "best_2rank": %s, ' \
    "$(joined "${results[@]}")" "$(joined "${peers[@]:+${peers[@]}}")" "$(joined "${rows[@]}")" "$best"
  printf '"ratios": {"best_2rank_vs_local": %s, "best_2rank_vs_ddp": %s, "downpour_2_vs_ddp": %s, ' \
    "$vs_local" "$vs_ddp" "$downpour_vs_ddp"
  printf '"sync_2_vs_ddp": %s, "local_vs_torch_plain": %s}, "wait_share": {%s}, ' \
    "$sync_vs_ddp" "$local_vs_torch" "$(joined "${waits[@]:+${waits[@]}}")"
  printf '"accuracy_gaps": {%s}}' "$(accuracy_gaps "$model")"
}

print_json() {
  local model key first=${models%% *} first_rows=() entries=() torch_version=null
  for key in $(our_keys "$first"); do first_rows+=("$(with_speedup "$first" "$key")"); done
  for model in $models; do entries+=("$(model_json "$model")"); done
  for key in "${!summary[@]}"; do
    [[ "$key" != */torch_plain/* ]] ||
      torch_version="\"$(sed -E 's/.*"torch": "([^"]*)".*/\1/' <<<"${summary[$key]}")\""
  done
  printf '{"machine": {"cores": %d, "train_samples": %d, "cnn_train_samples": %d, "epochs": %d, "torch": %s}, ' \
    "$(nproc)" "$train" "$cnn_train" "$epochs" "$torch_version"
  printf '"results": [%s], "models": {%s}}\n' "$(joined "${first_rows[@]}")" "$(joined "${entries[@]}")"
}

print_table() {
  local model key r base best vs_local vs_ddp downpour_vs_ddp sync_vs_ddp local_vs_torch
  for model in $models; do
    base=$(sps_of "$model/local/1")
    printf '\n%s: %s parameters (PyTorch peer: %s), %d training samples, batch 64 per rank\n' \
      "$model" "${parameters[$model]:-?}" "${peer_parameters[$model]:--}" "$(samples_of "$model")"
    printf '%-11s %5s %10s %8s %8s %6s %5s %8s %7s %5s %5s\n' \
      mode ranks samples/s epoch_s speedup test data compute master mpi wait
    for key in $(our_keys "$model"); do
      r=${summary[$key]}
      awk -v mode="$(mode_of "$r")" -v ranks="$(field "$r" ranks)" \
          -v sps="$(field "$r" samples_per_s)" -v ep="$(field "$r" epoch_s)" -v base="$base" \
          -v acc="$(field "$r" test_accuracy)" \
          -v d="$(field "$r" data)" -v c="$(field "$r" compute)" \
          -v m="$(field "$r" master)" -v p="$(field "$r" mpi)" \
          'BEGIN{printf "%-11s %5d %10.0f %8.2f %7.2fx %6.3f %4.0f%% %7.0f%% %6.0f%% %4.0f%% %4.0f%%\n",
                 mode, ranks, sps, ep, sps/base, acc, 100*d, 100*c, 100*m, 100*p, 100*(m+p)}'
    done
    for key in $(peer_keys "$model"); do
      r=${summary[$key]}
      awk -v mode="$(mode_of "$r")" -v ranks="$(field "$r" ranks)" \
          -v sps="$(field "$r" samples_per_s)" -v t="$(field "$r" train_s)" -v base="$base" \
          -v acc="$(field "$r" test_accuracy)" -v epochs="$epochs" \
          'BEGIN{printf "%-11s %5d %10.0f %8.2f %7.2fx %6.3f %5s %8s %7s %5s %5s\n",
                 mode, ranks, sps, t/epochs, sps/base, acc, "-", "-", "-", "-", "-"}'
    done
    read -r best vs_local vs_ddp downpour_vs_ddp sync_vs_ddp local_vs_torch <<<"$(ratios "$model")"
    printf 'best 2-rank (%s) vs local %s, vs DDP %s; downpour 2 vs DDP %s; sync 2 vs DDP %s;' \
      "$best" "$vs_local" "$vs_ddp" "$downpour_vs_ddp" "$sync_vs_ddp"
    printf ' local vs PyTorch plain %s\n' "$local_vs_torch"
    printf 'test accuracy, ours minus the peer (same seed, same order): %s\n' \
      "$(accuracy_gaps "$model" | tr -d '"' | sed 's/,/, /g')"
  done
}

if $json; then print_json; exit 0; fi
[ -z "$json_file" ] || print_json >"$json_file"
print_table
