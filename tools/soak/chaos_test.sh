#!/usr/bin/env bash
# The chaos run (tools/soak/chaos.sh) on a reduced job: the MLP, sync, 20 epochs
# of 30,000 images (about 45 s undisturbed on 2 idle cores), with the full
# schedule of SIGKILLs (a rank, a group, the validation pool, the master with
# restart). Passes when every check of the chaos run passes; prints a SKIP
# line and passes when Debian's dataset-fashion-mnist is not installed.
# About 2 minutes: tagged manual, run it with `bazel test -c opt
# //tools/soak:chaos_test`.
set -euo pipefail

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: Debian's dataset-fashion-mnist is not installed"
  exit 0
fi
[ -x /usr/bin/python3 ] || { echo "SKIP: no /usr/bin/python3"; exit 0; }

chaos="${RUNFILES_DIR:-$0.runfiles}/mpilearn/tools/soak/chaos"
[ -x "$chaos" ] || chaos="$(cd "$(dirname "$0")" && pwd)/chaos.sh"

out=$("$chaos" --json --model mlp --epochs 20 --train_limit 35000) || {
  echo "FAIL: the chaos run failed:"
  echo "$out"
  exit 1
}
echo "$out"
grep -q '"pass": true' <<<"$out" || { echo "FAIL: no \"pass\": true in the JSON"; exit 1; }
# One JSON object, with every kill of the schedule recorded.
[ "$(grep -c . <<<"$out")" -eq 1 ] || { echo "FAIL: --json printed more than one line"; exit 1; }
for what in rank group pool master; do
  grep -q "\"what\": \"$what\"" <<<"$out" || { echo "FAIL: no $what kill recorded"; exit 1; }
done
echo "PASS"
