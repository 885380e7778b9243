#!/usr/bin/env bash
# Proves that tools/bench/bench_torch_peer.py's plain loop computes what
# `mpilearn-worker --local` computes for the same spec: the same initial
# weights (torch.manual_seed(seed), layers drawn in the same order) and the
# same sample order (the epoch's permutation of docs/protocol.md, seeded
# seed * 1000003 + epoch, cut into data units). bench_scaling compares their
# test accuracies as a paired comparison; an earlier peer drew its own
# order, and its accuracy differed from ours by up to 4 points on the same
# seed from the order alone.
#
# The MLP on 3,000 Fashion-MNIST samples in data units of 1,000 (15 full
# batches of 64 and one of 40 per unit, so the batches follow the units),
# two seeds, two epochs (the second epoch's order is a fresh one): both
# must reach the same validation and test accuracy and last-epoch train
# loss within 0.003 (float rounding only: the two sides sum in different
# orders; seed 1 agrees to the last printed digit). At this size the
# earlier peer's order moved test accuracy by 3 points, and batches that
# ignore the unit cut by 0.5 (validation accuracy by 1.4).
#
# Needs Debian's python3-torch under /usr/bin/python3 and the
# dataset-fashion-mnist package; without them the test says so and passes.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:?must run under bazel test}/mpilearn"
WORKER="$RUNFILES/worker/mpilearn-worker"
PEER="$RUNFILES/tools/bench/bench_torch_peer.py"
TMP="${TEST_TMPDIR:?}"
PY=/usr/bin/python3
DATA=/usr/share/datasets/fashion-mnist

if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "SKIPPED: $PY cannot import torch; install python3-torch" \
    "(tools/install_deps.sh) to run this test"
  exit 0
fi
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  echo "SKIPPED: no $DATA (Debian's dataset-fashion-mnist)"
  exit 0
fi

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# field JSON KEY: a number out of a flat JSON object.
field() { sed -E "s/.*\"$2\": ([0-9.eE+-]+).*/\1/" <<<"$1"; }

# close A B WHAT: |A - B| <= 0.003.
close() {
  awk -v a="$1" -v b="$2" 'BEGIN{d = a - b; if (d < 0) d = -d; exit !(d <= 0.003)}' ||
    fail "$3: worker $1, peer $2 (want within 0.003)"
}

train=3000
unit=1000
for seed in 1 2; do
  cat >"$TMP/spec-$seed.json" <<JSON
{"name": "peer-parity-$seed", "model": {"name": "mlp"},
 "data": {"train_images": "$DATA/train-images-idx3-ubyte.gz",
          "train_labels": "$DATA/train-labels-idx1-ubyte.gz",
          "test_images": "$DATA/t10k-images-idx3-ubyte.gz",
          "test_labels": "$DATA/t10k-labels-idx1-ubyte.gz",
          "train_limit": $((train + 1000)), "validation_count": 1000},
 "algorithm": "sync", "epochs": 2, "batch_size": 64, "seed": $seed,
 "data_unit_size": $unit}
JSON
  "$WORKER" --local --job "$TMP/spec-$seed.json" --threads 1 \
    --local_state_dir "$TMP/state-$seed" --summary_json "$TMP/worker-$seed.json" \
    >"$TMP/worker-$seed.log" 2>&1 ||
    fail "the worker (seed $seed) failed: $(tail -5 "$TMP/worker-$seed.log")"
  ours=$(cat "$TMP/worker-$seed.json")
  peer=$("$PY" "$PEER" --model mlp --train "$train" --validation_count 1000 \
           --epochs 2 --batch 64 --lr 0.001 --seed "$seed" --data_unit_size "$unit" \
           2>"$TMP/peer-$seed.log") ||
    fail "the peer (seed $seed) failed: $(tail -5 "$TMP/peer-$seed.log")"
  [ "$(field "$peer" samples)" = $((2 * train)) ] ||
    fail "the peer trained $(field "$peer" samples) samples, want $((2 * train))"
  close "$(field "$ours" test_accuracy)" "$(field "$peer" test_accuracy)" \
    "seed $seed test accuracy"
  # The worker's progress line of the last epoch: "epoch 2/2  train_loss=L
  # val_loss=V  val_acc=A ...".
  last=$(grep -E '^epoch 2/2 ' "$TMP/worker-$seed.log" | tail -1)
  [ -n "$last" ] || fail "no 'epoch 2/2' line in the worker's output (seed $seed)"
  close "$(sed -E 's/.*val_acc=([0-9.]+).*/\1/' <<<"$last")" \
    "$(field "$peer" val_accuracy)" "seed $seed validation accuracy"
  close "$(sed -E 's/.*train_loss=([0-9.]+).*/\1/' <<<"$last")" \
    "$(field "$peer" train_loss)" "seed $seed last epoch's train loss"
  echo "seed $seed: test accuracy worker $(field "$ours" test_accuracy)," \
    "peer $(field "$peer" test_accuracy)"
done
echo PASS
