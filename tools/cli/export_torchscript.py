#!/usr/bin/python3
"""Turns a Python model file into a scripted TorchScript file MPI Learn trains.

MODEL.py defines get_model(**params) returning a torch.nn.Module (mpi_learn's
convention). This tool imports the file, builds the model with the given
params, compiles it with torch.jit.script (never torch.jit.trace), checks it
the way the worker will use it, and saves it:

    /usr/bin/python3 tools/cli/export_torchscript.py \\
        docs/examples/models/mlp.py --param hidden=[512,256] \\
        --input_shape 1,28,28 --outputs 10 --out mlp.pt

Then name the file in the job spec: "model": {"torchscript": "/abs/mlp.pt"}.
See docs/torchscript.md. A model of several inputs takes --input_shape once
per input (forward(self, x0, x1, ...) in that order) and may return a tuple of
tensors, one per output (--outputs 3,1 then checks each one's width).

Checks, in order: the model scripts; its parameters are float32 on the CPU
and at least one is trainable; forward takes one tensor per --input_shape; no
operator has its
train/eval mode fixed (what tracing does to dropout and BatchNorm); one
forward in train mode on a random batch of 2 samples of --input_shape, one
backward of output.sum() that reaches every trainable parameter (a warning
names those it misses), one forward in eval mode; the output's first
dimension is the batch and, with --outputs, its last dimension (1 for a 1-D
output) equals it. The forward passes do not change the saved file: buffers
(BatchNorm running statistics) are restored before saving, and the module is
saved in train mode.

--check FILE.pt inspects a file that exists (written by this tool, by hand
or by another PyTorch version): it loads, is not frozen, has trainable
parameters, no train/eval flag is baked in, its file format version is one
LibTorch 1.13 reads; with --input_shape it also runs the forward/backward
checks. What --check cannot tell: a traced module whose graph has no
mode-dependent operator (no dropout, BatchNorm or recurrent dropout) looks
like a scripted one, and behaves like one in train and eval mode, but its
control flow and shapes were fixed by the example input. Run --check under
PyTorch 1.13 (Debian's python3-torch) to prove LibTorch 1.13 loads the file:
a newer PyTorch can write, and itself load, operators 1.13 lacks.

Exit status: 0 ok; 1 a problem with the model or the file (the message says
what and how to fix it); 2 a usage error (bad flags, missing MODEL.py).
"""

import argparse
import importlib.util
import json
import os
import re
import sys
import zipfile

EXIT_OK = 0
EXIT_MODEL = 1
EXIT_USAGE = 2

# The highest TorchScript file format version LibTorch 1.13 reads
# (caffe2/serialize/versions.h, kMaxSupportedFileFormatVersion).
MAX_FILE_FORMAT_VERSION_1_13 = 10

# Argument names by which operators take the train/eval mode. Scripted
# modules pass self.training (a value read at run time); tracing records
# the mode at trace time as a constant.
TRAIN_ARGUMENTS = ("train", "training")
# Operators whose result depends on that argument.
MODE_OPERATORS = (
        "aten::dropout", "aten::dropout_", "aten::feature_dropout",
        "aten::feature_dropout_", "aten::alpha_dropout",
        "aten::alpha_dropout_",
        "aten::feature_alpha_dropout", "aten::feature_alpha_dropout_",
        "aten::batch_norm", "aten::gru", "aten::lstm", "aten::rnn_tanh",
        "aten::rnn_relu",
)

SCRIPT_HINTS = """\
How to fix typical causes (see the TorchScript language reference,
https://pytorch.org/docs/1.13/jit_language_reference.html):
  - Arguments that are not Tensors need type annotations:
      def forward(self, x: torch.Tensor, lengths: List[int]) -> torch.Tensor
  - Iterate over nn.ModuleList/nn.Sequential directly ("for layer in
    self.layers"), not by index or with getattr(self, name).
  - No *args/**kwargs in forward, no calls into numpy or other Python
    libraries, no Python classes TorchScript does not know.
  - Attributes that may be None need a type: Optional[torch.Tensor].
  - Python-only code that forward calls (printing Python objects, numpy):
    take it out of forward, or mark that method @torch.jit.unused.
Do not fall back to torch.jit.trace: a traced module has its dropout and
BatchNorm train/eval mode baked in, and MPI Learn refuses it."""


class ModelError(Exception):
    """A problem with the model or the file: exit status 1."""


class UsageError(Exception):
    """A problem with the command line: exit status 2."""


def parse_shape(text):
    """'1,28,28' -> [1, 28, 28]; every dimension positive."""
    try:
        shape = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--input_shape {text!r}: want positive integers "
                         "separated by commas, e.g. 1,28,28")
    if not shape or any(dim <= 0 for dim in shape):
        raise UsageError(
            f"--input_shape {text!r}: every dimension must be > 0")
    return shape


def parse_outputs(text):
    """--outputs "10" or "3,1": a list of widths, or None."""
    if text is None:
        return None
    try:
        widths = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--outputs {text!r}: want positive integers "
                         "separated by commas, e.g. 10 or 3,1")
    if any(w <= 0 for w in widths):
        raise UsageError(f"--outputs {text!r}: every width must be > 0")
    return widths


def parse_params(params_arg, param_args):
    """The keyword arguments for get_model: --params, then each --param."""
    params = {}
    if params_arg is not None:
        text = params_arg
        if os.path.isfile(params_arg):
            try:
                with open(params_arg) as f:
                    text = f.read()
            except OSError as e:
                raise UsageError(f"--params {params_arg}: {e.strerror}")
        try:
            params = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--params {params_arg!r}: neither a file nor "
                             f"valid JSON ({e})")
        if not isinstance(params, dict):
            raise UsageError(f"--params {params_arg!r}: want a JSON object "
                             "({\"name\": value, ...})")
    for item in param_args:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--param {item!r}: want name=value, e.g. "
                             "hidden=[512,256] or activation=relu")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value  # a plain string: activation=relu
    return params


def import_model_file(path):
    """Imports MODEL.py by path and returns the module object."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    # A valid identifier: TorchScript names the classes __torch__.<name>.Net.
    name = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    if not name or name[0].isdigit():
        name = "model_" + name
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # torch.jit.script reads the classes' source through sys.modules.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ModelError(f"{path}: importing it failed: "
                         f"{type(e).__name__}: {e}") from e
    return module


def build_model(path, params):
    import torch
    module = import_model_file(path)
    get_model = getattr(module, "get_model", None)
    if not callable(get_model):
        raise ModelError(f"{path}: defines no get_model(**params) function")
    try:
        model = get_model(**params)
    except Exception as e:
        raise ModelError(f"{path}: get_model(**{params!r}) failed: "
                         f"{type(e).__name__}: {e}") from e
    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"{path}: get_model returned a "
                         f"{type(model).__name__}, not a torch.nn.Module")
    return model


def script_model(model):
    import torch
    if isinstance(model, torch.jit.ScriptModule):
        # Already compiled (scripted, or traced: the mode check finds that).
        return model
    try:
        return torch.jit.script(model)
    except Exception as e:
        raise ModelError("torch.jit.script failed; the model cannot be "
                         f"compiled as written:\n{e}\n{SCRIPT_HINTS}") from e


def walk_nodes(block):
    for node in block.nodes():
        yield node
        for sub in node.blocks():
            yield from walk_nodes(sub)


def baked_mode_operators(scripted):
    """Operators whose train/eval argument is a constant: 'op (arg=value)'."""
    import torch
    found = []
    for node in walk_nodes(scripted.inlined_graph):
        if node.kind() not in MODE_OPERATORS:
            continue
        schema = torch._C.parse_schema(node.schema())
        names = [argument.name for argument in schema.arguments]
        inputs = list(node.inputs())
        if node.kind() == "aten::batch_norm":
            # Without running statistics batch_norm uses the batch's statistics
            # in both modes, so a constant flag changes nothing.
            stats = inputs[names.index("running_mean")]
            if stats.type().kind() == "NoneType":
                continue
        for name in TRAIN_ARGUMENTS:
            if name in names:
                value = inputs[names.index(name)]
                if value.node().kind() == "prim::Constant":
                    found.append(f"{node.kind()} ({name}={value.toIValue()})")
    return found


def check_module(scripted, inputs=None):
    """Checks that need no input (forward taking `inputs` tensors: None, any
    count). Returns a list of warnings."""
    import torch
    if not hasattr(scripted, "training"):
        raise ModelError("the module has no train/eval mode: it was frozen "
                         "(torch.jit.freeze), which turns parameters into "
                         "constants. Export the scripted module without "
                         "freezing it.")
    parameters = list(scripted.named_parameters())
    trainable = [(n, p) for n, p in parameters if p.requires_grad]
    if not trainable:
        raise ModelError("the module has no trainable parameters (a frozen "
                         "module has none; parameters with "
                         "requires_grad=False are not trained)")
    for name, tensor in parameters + list(scripted.named_buffers()):
        if tensor.device.type != "cpu":
            raise ModelError(f"{name} is on {tensor.device}: build the model "
                             "on the CPU (the worker moves it to its "
                             "--device)")
        if tensor.is_floating_point() and tensor.dtype != torch.float32:
            raise ModelError(f"{name} is {tensor.dtype}: MPI Learn trains "
                             "float32; return model.float() from get_model")
    arguments = scripted.forward.schema.arguments[1:]  # without self
    required = [a for a in arguments if not a.has_default_value()]
    tensors = [a for a in arguments
               if a.type.isSubtypeOf(torch._C.TensorType.get())]
    want = inputs if inputs is not None else max(1, len(required))
    takes_tensors = (arguments and len(required) <= want and
                     len(arguments) >= want and
                     all(a.type.isSubtypeOf(torch._C.TensorType.get())
                         for a in arguments[:want]) and tensors)
    if not takes_tensors:
        raise ModelError(
            f"forward is {scripted.forward.schema}: MPI Learn calls forward"
            + ("(x) with one Tensor, the batch" if want == 1 else
               f" with {want} Tensors, one per input (--input_shape), in order"))
    baked = baked_mode_operators(scripted)
    if baked:
        raise ModelError(
            "train/eval mode is fixed in the graph of: " +
            ", ".join(baked) + ". The module (or a submodule) was traced "
            "with torch.jit.trace, or calls these with a constant training "
            "flag. Export with torch.jit.script (this tool does), and pass "
            "self.training.")
    # train()/eval() must reach every submodule (dropout, BatchNorm).
    for mode in (False, True):
        scripted.train(mode)
        stale = [n for n, m in scripted.named_modules() if m.training != mode]
        if stale:
            raise ModelError(
                f"train({mode}) did not reach: {', '.join(stale)}")
    return []


def as_outputs(value, what):
    """A forward's result as a list of tensors (a tuple: one per output)."""
    import torch
    values = list(value) if isinstance(value, tuple) else [value]
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        raise ModelError(f"forward {what} returned a {type(value).__name__}: "
                         "it must return a Tensor [batch, outputs], or a "
                         "tuple of them (one per output)")
    return values


def run_checks(scripted, input_shapes, outputs):
    """Forward in train mode, backward, forward in eval mode on a random batch
    of 2 (one tensor per input shape). Leaves parameters, buffers and the mode
    as they were; returns (output shape per sample, warnings); a model of
    several outputs gives a list of shapes."""
    import torch
    warnings = []
    buffers = {n: b.detach().clone() for n, b in scripted.named_buffers()}
    batch = [torch.randn([2] + shape) for shape in input_shapes]
    try:
        scripted.train()
        output = as_outputs(scripted(*batch), "in train mode")
        sum(o.sum() for o in output).backward()
        scripted.eval()
        with torch.no_grad():
            eval_output = as_outputs(scripted(*batch), "in eval mode")
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"forward/backward on a batch of shape "
                         f"{' and '.join(str(list(b.shape)) for b in batch)} "
                         f"failed:\n{e}") from e
    finally:
        scripted.train()
        with torch.no_grad():
            for name, buffer in scripted.named_buffers():
                buffer.copy_(buffers[name])
    if outputs is not None and len(outputs) != len(output):
        raise ModelError(f"forward returned {len(output)} output(s); "
                         f"--outputs names {len(outputs)}")
    per_sample = []
    for i, (out, eval_out) in enumerate(zip(output, eval_output)):
        name = f"output {i}" if len(output) > 1 else "output"
        if out.dim() == 0 or out.shape[0] != 2:
            raise ModelError(f"{name} shape {list(out.shape)} for a batch "
                             "of 2: the first dimension must be the batch")
        if not out.is_floating_point():
            raise ModelError(
                f"{name} is {out.dtype}: it must be floating point")
        if eval_out.shape != out.shape:
            raise ModelError(f"{name} shape {list(eval_out.shape)} in eval "
                             f"mode, {list(out.shape)} in train mode")
        if not torch.isfinite(out).all():
            raise ModelError(
                f"{name} of the first forward is not finite (NaN/inf)")
        per_sample.append(list(out.shape[1:]))
        if outputs is not None:
            last = per_sample[-1][-1] if per_sample[-1] else 1
            if last != outputs[i]:
                raise ModelError(
                    f"{name} shape {list(out.shape)}: its last dimension "
                    f"is {last}, --outputs is {outputs[i]}")
    if len(per_sample) == 1:
        per_sample = per_sample[0]
    missed = [n for n, p in scripted.named_parameters()
              if p.requires_grad and p.grad is None]
    if missed:
        warnings.append("backward reached no gradient for (unused in "
                        "forward?): " + ", ".join(missed))
    for parameter in scripted.parameters():
        parameter.grad = None
    return per_sample, warnings


def file_format_version(path):
    """The version record of a TorchScript zip archive, or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                if name.count("/") == 1 and name.endswith("/version"):
                    return int(archive.read(name).decode().strip())
    except (zipfile.BadZipFile, ValueError, OSError):
        pass
    return None


def describe(scripted, input_shape, per_sample, path):
    import torch
    trainable = [p for p in scripted.parameters() if p.requires_grad]
    lines = [
            f"  parameters: {sum(p.numel() for p in trainable)} in "
            f"{len(trainable)} tensors",
    ]
    if input_shape is not None:
        shown = input_shape[0] if len(input_shape) == 1 else input_shape
        lines.append(f"  input shape: {shown} per sample")
        lines.append(f"  output shape: {per_sample} per sample")
    for name, buffer in scripted.named_buffers():
        rule = ("exchanged with the master" if buffer.is_floating_point()
                else "kept per rank")
        lines.append(f"  buffer {name}: {list(buffer.shape)} "
                     f"{str(buffer.dtype).replace('torch.', '')} ({rule})")
    version = file_format_version(path)
    lines.append(f"  file format version {version}, written or read by "
                 f"torch {torch.__version__}")
    return lines


def check_version(path):
    import torch
    version = file_format_version(path)
    if version is None:
        raise ModelError(
            f"{path}: not a TorchScript archive (no version record)")
    if version > MAX_FILE_FORMAT_VERSION_1_13:
        raise ModelError(f"{path}: file format version {version}; LibTorch "
                         f"1.13 reads up to {MAX_FILE_FORMAT_VERSION_1_13}. "
                         "Export "
                         "with PyTorch 1.13 (/usr/bin/python3 on Debian 12).")
    warnings = []
    if not torch.__version__.startswith("1.13"):
        warnings.append(f"torch {torch.__version__} is not 1.13: LibTorch "
                        "1.13 may lack operators this file uses. Run --check "
                        "under PyTorch 1.13 to be sure.")
    return warnings


def export(args):
    import torch
    if args.out is None or args.input_shape is None:
        raise UsageError("exporting MODEL.py needs --out and --input_shape")
    input_shape = [parse_shape(s) for s in args.input_shape]
    outputs = parse_outputs(args.outputs)
    params = parse_params(args.params, args.param)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    model = build_model(args.model, params)
    scripted = script_model(model)
    warnings = check_module(scripted, len(input_shape))
    per_sample, more = run_checks(scripted, input_shape, outputs)
    warnings += more
    try:
        scripted.save(args.out)
    except Exception as e:
        raise ModelError(f"saving {args.out} failed: {e}") from e
    # What the worker will load: the file, checked again.
    loaded = torch.jit.load(args.out)
    check_module(loaded, len(input_shape))
    run_checks(loaded, input_shape, outputs)
    warnings += check_version(args.out)
    print(f"wrote {args.out}: get_model(**{json.dumps(params)}) from "
          f"{args.model}, scripted")
    print("\n".join(describe(loaded, input_shape, per_sample, args.out)))
    return warnings


def check_file(args):
    import torch
    path = args.check
    if not os.path.isfile(path):
        raise UsageError(f"--check {path}: no such file")
    try:
        loaded = torch.jit.load(path)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ModelError(f"{path}: torch.jit.load failed (not a "
                         "TorchScript file, or written by a newer PyTorch): "
                         f"{first}") from e
    warnings = check_version(path)
    input_shape = per_sample = None
    if args.input_shape is not None:
        input_shape = [parse_shape(s) for s in args.input_shape]
    warnings += check_module(
        loaded, None if input_shape is None else len(input_shape))
    if input_shape is not None:
        per_sample, more = run_checks(loaded, input_shape,
                                      parse_outputs(args.outputs))
        warnings += more
    print(f"{path}: ok (loads, scripted as far as the graph shows, trainable)")
    print("\n".join(describe(loaded, input_shape, per_sample, path)))
    return warnings


def main(argv):
    parser = argparse.ArgumentParser(
            prog="export_torchscript.py",
            description=__doc__.split("\n\n", 1)[1],
            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", metavar="MODEL.py",
                        help="Python file defining get_model(**params)")
    parser.add_argument("--out", metavar="FILE.pt",
                        help="where to write the scripted module")
    parser.add_argument("--input_shape", metavar="D1,D2,...",
                        action="append",
                        help="shape of one sample without the batch dimension,"
                        " e.g. 1,28,28 (Fashion-MNIST) or 20,6 ([T, F]); "
                        "once per input for a model of several inputs")
    parser.add_argument("--outputs", metavar="N[,N...]",
                        help="require the output's last dimension to be N "
                        "(classes, or regression targets); a model returning "
                        "a tuple: one N per output, e.g. 3,1")
    parser.add_argument("--params", metavar="JSON",
                        help="get_model's keyword arguments: a JSON object, "
                        "inline or the path of a file holding one")
    parser.add_argument("--param", action="append", default=[],
                        metavar="NAME=VALUE",
                        help="one keyword argument, repeatable, applied after "
                        "--params; VALUE is JSON when it parses "
                        "(hidden=[64,32], dropout=0.2), else a string")
    parser.add_argument("--seed", type=int,
                        help="seed torch's generator before get_model, so the "
                        "initial weights are reproducible")
    parser.add_argument("--check", metavar="FILE.pt",
                        help="inspect an existing file instead of exporting "
                        "(with --input_shape, also run it)")
    args = parser.parse_args(argv)
    try:
        if (args.check is None) == (args.model is None):
            raise UsageError("give MODEL.py to export, or --check FILE.pt")
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UsageError(f"{sys.executable} cannot import torch: run with "
                             "/usr/bin/python3 (Debian's python3-torch)")
        warnings = check_file(args) if args.check else export(args)
    except UsageError as e:
        parser.print_usage(sys.stderr)
        print(f"export_torchscript.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ModelError as e:
        print(f"export_torchscript.py: model problem: {e}", file=sys.stderr)
        return EXIT_MODEL
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
