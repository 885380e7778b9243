#!/usr/bin/env bash
# Proves tools/cli/export_torchscript.py: exports every example model in
# docs/examples/models with the parameter count computed by hand, loads the
# files with torch.jit.load (in train mode, buffers as initialized, dropout
# and BatchNorm following train/eval), and checks the refusals: a traced and
# a frozen module (--check), a model that does not script, a wrong
# --outputs, and usage errors. --param and --params change the architecture.
#
# Needs Debian's python3-torch (1.13) under /usr/bin/python3; the CI
# installs it (tools/install_deps.sh). Without it the test says so and
# passes, as the helper cannot run at all there.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:?must run under bazel test}/mpilearn"
TOOL="$RUNFILES/tools/cli/export_torchscript.py"
MODELS="$RUNFILES/docs/examples/models"
TMP="${TEST_TMPDIR:?}"
PY=/usr/bin/python3

if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "SKIPPED: $PY cannot import torch; install python3-torch" \
    "(tools/install_deps.sh) to run this test"
  exit 0
fi

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# expect RC PATTERN CMD...: runs CMD, requires exit status RC and output
# (stdout and stderr) matching the extended regex PATTERN. Sets $OUTPUT.
expect() {
  local want_rc="$1" pattern="$2"
  shift 2
  local rc=0
  OUTPUT="$("$@" 2>&1)" || rc=$?
  if [[ "$rc" != "$want_rc" ]]; then
    fail "'$*' exited $rc, want $want_rc; output:"$'\n'"$OUTPUT"
  fi
  if ! grep -Eq -- "$pattern" <<<"$OUTPUT"; then
    fail "'$*' output does not match /$pattern/:"$'\n'"$OUTPUT"
  fi
  echo "ok: ${*##*/} -> exit $rc"
}

export_model() { "$PY" "$TOOL" "$@"; }

# --- Every example exports, with the parameter count computed by hand. ----
# mlp [256, 128]: (784*256 + 256) + (256*128 + 128) + (128*10 + 10).
expect 0 "parameters: 235146 in 6 tensors" export_model \
  "$MODELS/mlp.py" --input_shape 1,28,28 --outputs 10 --out "$TMP/mlp.pt"
# cnn_bn: conv1 1*32*9+32, bn1 2*32, conv2 32*64*9+64, bn2 2*64,
# fc1 64*7*7*128+128, bn3 2*128, out 128*10+10.
expect 0 "parameters: 422090 in 14 tensors" export_model \
  "$MODELS/cnn_bn.py" --input_shape 1,28,28 --outputs 10 --out "$TMP/cnn_bn.pt"
grep -q "buffer bn1.running_mean: \[32\] float32 (exchanged" <<<"$OUTPUT" ||
  fail "cnn_bn: running_mean not listed as an exchanged buffer:"$'\n'"$OUTPUT"
grep -q "buffer bn1.num_batches_tracked: \[\] int64 (kept per rank)" \
  <<<"$OUTPUT" || fail "cnn_bn: num_batches_tracked not per rank"
# gru_jets: GRU 3*64*(6+64) + 2*3*64, fc1 64*64+64, out 64*5+5.
expect 0 "parameters: 18309 in 8 tensors" export_model \
  "$MODELS/gru_jets.py" --input_shape 20,6 --outputs 5 --out "$TMP/gru_jets.pt"
# regression_mlp: (8*64 + 64) + (64*64 + 64) + (64*2 + 2).
expect 0 "parameters: 4866 in 6 tensors" export_model \
  "$MODELS/regression_mlp.py" --input_shape 8 --outputs 2 \
  --out "$TMP/regression_mlp.pt"
# jets_two_heads, two inputs and two outputs: jet 4*64+64, track 3*64+64,
# shared 128*64+64 and 64*64+64, kind 64*3+3, energy 64+1.
expect 0 "output shape: \[\[3\], \[1\]\] per sample" export_model \
  "$MODELS/jets_two_heads.py" --input_shape 4 --input_shape 8,3 \
  --outputs 3,1 --out "$TMP/jets_two_heads.pt"
grep -q "parameters: 13252 in 12 tensors" <<<"$OUTPUT" ||
  fail "jets_two_heads: parameter count:"$'\n'"$OUTPUT"
# One shape for a forward of two inputs; a width that is not the output's.
expect 1 "calls forward\(x\) with one Tensor" export_model \
  "$MODELS/jets_two_heads.py" --input_shape 4 --out "$TMP/bad.pt"
expect 1 "output 1 shape \[2, 1\]: its last dimension is 1, --outputs is 2" \
  export_model "$MODELS/jets_two_heads.py" --input_shape 4 --input_shape 8,3 \
  --outputs 3,2 --out "$TMP/bad.pt"
expect 1 "forward returned 2 output\(s\); --outputs names 1" export_model \
  "$MODELS/jets_two_heads.py" --input_shape 4 --input_shape 8,3 --outputs 3 \
  --out "$TMP/bad.pt"

# --- The files load as the worker will use them. -------------------------
"$PY" - "$TMP" <<'PYEOF' || fail "loading the exported files"
import sys
import torch

tmp = sys.argv[1]
cases = {"mlp": ([1, 28, 28], 10), "cnn_bn": ([1, 28, 28], 10),
         "gru_jets": ([20, 6], 5), "regression_mlp": ([8], 2)}
for name, (shape, outputs) in cases.items():
    model = torch.jit.load(f"{tmp}/{name}.pt")
    assert model.training, f"{name}: saved in eval mode"
    model.eval()
    with torch.no_grad():
        x = torch.randn([3] + shape)
        y = model(x)
        assert list(y.shape) == [3, outputs], f"{name}: output {y.shape}"
        assert torch.equal(y, model(x)), f"{name}: eval mode not deterministic"
    print(f"ok: {name}.pt loads, output {list(y.shape)}")

# The export's forward passes left the BatchNorm buffers as PyTorch
# initializes them, and dropout follows train().
cnn = torch.jit.load(f"{tmp}/cnn_bn.pt")
for bn in (cnn.bn1, cnn.bn2, cnn.bn3):
    assert torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))
    assert torch.equal(bn.running_var, torch.ones_like(bn.running_var))
    assert int(bn.num_batches_tracked) == 0
cnn.train()
x = torch.randn(4, 1, 28, 28)
assert not torch.equal(cnn(x), cnn(x)), "dropout inactive in train mode"
assert int(cnn.bn1.num_batches_tracked) == 2, "BatchNorm not in train mode"
print("ok: cnn_bn buffers as initialized; train()/eval() switch dropout")
PYEOF

# --- --param and --params change the architecture. -----------------------
# hidden [32]: (784*32 + 32) + (32*10 + 10).
expect 0 "parameters: 25450 in 4 tensors" export_model "$MODELS/mlp.py" \
  --param 'hidden=[32]' --input_shape 1,28,28 --out "$TMP/mlp32.pt"
# --param overrides --params; dropout adds no parameters.
echo '{"hidden": [64, 64], "dropout": 0.5}' >"$TMP/params.json"
expect 0 "parameters: 6370 in 4 tensors" export_model "$MODELS/mlp.py" \
  --params "$TMP/params.json" --param 'hidden=[8]' --input_shape 1,28,28 \
  --out "$TMP/mlp8.pt"  # (784*8 + 8) + (8*10 + 10)
# GRU 3*4*(3+4) + 2*3*4, fc1 4*4+4, out 4*2+2.
expect 0 "parameters: 138 in 8 tensors" export_model "$MODELS/gru_jets.py" \
  --params '{"units": 4, "dense": 4}' --param features=3 --param classes=2 \
  --input_shape 10,3 --outputs 2 --out "$TMP/gru_small.pt"

# --- --check: a scripted file passes, traced and frozen ones are refused. --
"$PY" - "$TMP" <<'PYEOF' 2>/dev/null || fail "writing the --check fixtures"
import sys
import torch
from torch import nn

tmp = sys.argv[1]
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                    nn.Dropout(0.5), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
torch.jit.script(net).save(f"{tmp}/scripted.pt")
example = torch.randn(2, 1, 28, 28)
torch.jit.trace(net, example, check_trace=False).save(f"{tmp}/traced.pt")
net.eval()
torch.jit.trace(net, example).save(f"{tmp}/traced_eval.pt")
torch.jit.freeze(torch.jit.script(net)).save(f"{tmp}/frozen.pt")
PYEOF
expect 0 "scripted.pt: ok" export_model --check "$TMP/scripted.pt" \
  --input_shape 1,28,28 --outputs 10
expect 0 "mlp.pt: ok" export_model --check "$TMP/mlp.pt"
expect 1 "aten::dropout \(train=True\).*torch.jit.trace" export_model \
  --check "$TMP/traced.pt"
expect 1 "aten::batch_norm \(training=False\).*torch.jit.trace" export_model \
  --check "$TMP/traced_eval.pt"
expect 1 "frozen \(torch.jit.freeze\)" export_model --check "$TMP/frozen.pt"
expect 1 "torch.jit.load failed" export_model --check "$TMP/params.json"
expect 1 "last dimension is 10, --outputs is 3" export_model \
  --check "$TMP/scripted.pt" --input_shape 1,28,28 --outputs 3

# --- Models with problems: exit 1 and a message saying what. ------------
cat >"$TMP/unscriptable.py" <<'PYEOF'
from torch import nn


class TakesVarargs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x, *extra):  # TorchScript compiles no *args
        return self.fc(x)


def get_model():
    return TakesVarargs()
PYEOF
expect 1 "torch.jit.script failed" \
  export_model "$TMP/unscriptable.py" --input_shape 4 --out "$TMP/u.pt"
grep -q "How to fix typical causes" <<<"$OUTPUT" || fail "no hints printed"
[[ ! -e "$TMP/u.pt" ]] || fail "a model that does not script was saved"
expect 1 "output shape \[2, 10\]: its last dimension is 10, --outputs is 5" \
  export_model "$MODELS/mlp.py" --input_shape 1,28,28 --outputs 5 \
  --out "$TMP/x.pt"
expect 1 "mat1 and mat2 shapes cannot be multiplied" export_model \
  "$MODELS/mlp.py" --input_shape 3,3 --out "$TMP/x.pt"
expect 1 "unexpected keyword argument 'widths'" export_model \
  "$MODELS/mlp.py" --param 'widths=[3]' --input_shape 1,28,28 \
  --out "$TMP/x.pt"

# --- Usage errors: exit 2. -----------------------------------------------
expect 2 "needs --out and --input_shape" export_model "$MODELS/mlp.py" \
  --out "$TMP/x.pt"
expect 2 "give MODEL.py to export, or --check" export_model
expect 2 "no such file" export_model "$TMP/missing.py" --input_shape 4 \
  --out "$TMP/x.pt"
expect 2 "--input_shape '1,x'" export_model "$MODELS/mlp.py" \
  --input_shape 1,x --out "$TMP/x.pt"
expect 2 "want name=value" export_model "$MODELS/mlp.py" --param hidden \
  --input_shape 1,28,28 --out "$TMP/x.pt"
expect 2 "want a JSON object" export_model "$MODELS/mlp.py" --params '[1]' \
  --input_shape 1,28,28 --out "$TMP/x.pt"
expect 0 "Exit status: 0 ok" export_model --help

echo PASS
