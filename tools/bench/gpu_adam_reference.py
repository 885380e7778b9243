#!/usr/bin/env python3
"""PyTorch's own GPU optimizers, the peer of //server/core/update/cuda:cuda_engine_benchmark.

Times torch.optim steps on one GPU for the same parameter counts and the same
model-like split into tensors as the C++ benchmark, with CUDA events, and
prints one JSON object. Needs a CUDA PyTorch (the GPU machine's python3 has
2.11); Debian's CPU torch 1.13 cannot run it.

    python3 tools/bench/gpu_adam_reference.py --params 1170000,10000000,100000000

Per size and variant (e.g. adam fused, adam foreach) it reports:
  step_ms       one optimizer.step() with parameters, gradients and state on
                the GPU: the median of --repeats timings, each the mean of
                enough back-to-back steps to move about 4 GB;
  gbps          the bytes the step must move (read p, g and each state
                buffer, write p and each state buffer: 4 * (3 + 2 * buffers)
                bytes per parameter, the same count as the C++ benchmark)
                over step_ms, and copy_fraction = gbps / the device-to-device
                copy bandwidth measured here (bytes read + written);
  update_ms     the equivalent of the master's whole update: gradients copied
                from pinned host memory to the GPU, step(), weights copied
                back to pinned host memory, synchronised; median wall time.
"""

import argparse
import json
import socket
import statistics
import sys
import time

import torch

# (optimizer name, state buffers per parameter, constructor, variants).
# Hyper-parameters are PyTorch's defaults, as the C++ benchmark's resolved
# OptimizerSpecs are; sgd_momentum is sgd with momentum 0.9.
OPTIMIZERS = {
    "adam": (2, lambda p, **kw: torch.optim.Adam(p, lr=1e-3, **kw)),
    "adamw": (2, lambda p, **kw: torch.optim.AdamW(p, lr=1e-3, **kw)),
    "sgd": (0, lambda p, **kw: torch.optim.SGD(p, lr=1e-2, **kw)),
    "sgd_momentum":
        (1, lambda p, **kw: torch.optim.SGD(p, lr=1e-2, momentum=0.9, **kw)),
    "rmsprop": (1, lambda p, **kw: torch.optim.RMSprop(p, lr=1e-2, **kw)),
    "adadelta": (2, lambda p, **kw: torch.optim.Adadelta(p, lr=1.0, **kw)),
    "adagrad": (1, lambda p, **kw: torch.optim.Adagrad(p, lr=1e-2, **kw)),
}
VARIANTS = {"fused": {"fused": True}, "foreach": {"foreach": True},
            "for_loop": {"foreach": False}}
TARGET_BYTES_PER_TIMING = 4e9


def model_like_sizes(params):
    """The C++ benchmark's split: four large tensors, each with a bias."""
    sizes, used = [], 0
    for share in (0.45, 0.30, 0.15, 0.08):
        sizes.append(int(params * share))
        used += sizes[-1]
        sizes.append(min(512, params // 1000 + 1))
        used += sizes[-1]
    sizes.append(params - used if params > used else 1)
    return sizes


def copy_gbps(device, nbytes=512 << 20, iterations=20):
    src = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    start.record()
    for _ in range(iterations):
        dst.copy_(src)
    stop.record()
    stop.synchronize()
    return 2.0 * nbytes * iterations / (start.elapsed_time(stop) * 1e-3) / 1e9


def measure(name, variant, sizes, device, steps, repeats):
    buffers, make = OPTIMIZERS[name]
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(n, device=device) * 0.01)
              for n in sizes]
    for p in params:
        p.grad = torch.randn(p.numel(), device=device) * 0.01
    optimizer = make(params, **VARIANTS[variant])
    total = sum(sizes)
    bytes_per_param = 4.0 * (3 + 2 * buffers)

    # Whole update: pinned host gradients in, weights out.
    host_grads = [torch.randn(n).mul_(0.01).pin_memory() for n in sizes]
    host_params = [torch.empty(n).pin_memory() for n in sizes]
    update_ms = []
    for i in range(steps + 2):
        begin = time.perf_counter()
        for p, g in zip(params, host_grads):
            p.grad.copy_(g, non_blocking=True)
        optimizer.step()
        for h, p in zip(host_params, params):
            h.copy_(p.detach(), non_blocking=True)
        torch.cuda.synchronize(device)
        if i >= 2:
            update_ms.append((time.perf_counter() - begin) * 1e3)

    iterations = int(min(2000, max(10, TARGET_BYTES_PER_TIMING /
                                   (bytes_per_param * total))))
    start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    for _ in range(iterations):  # warm-up, as the C++ benchmark's
        optimizer.step()
    kernel_ms = []
    for _ in range(repeats):
        start.record()
        for _ in range(iterations):
            optimizer.step()
        stop.record()
        stop.synchronize()
        kernel_ms.append(start.elapsed_time(stop) / iterations)
    del optimizer, params, host_grads, host_params
    torch.cuda.empty_cache()
    step_ms = statistics.median(kernel_ms)
    return {
        "optimizer": name, "variant": variant, "params": total,
        "bytes_per_param": bytes_per_param, "iterations": iterations,
        "step_ms": step_ms, "step_ms_repeats": kernel_ms,
        "gbps": bytes_per_param * total / (step_ms * 1e6),
        "update_ms": statistics.median(update_ms),
        "update_ms_range": [min(update_ms), max(update_ms)],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="1170000,10000000,100000000")
    parser.add_argument(
        "--runs", default="adam:fused,adam:foreach,adamw:fused,adamw:foreach,"
        "sgd:fused,sgd:foreach,sgd_momentum:fused,sgd_momentum:foreach,"
        "rmsprop:foreach,adadelta:foreach,adagrad:foreach",
        help="optimizer:variant pairs; variants: fused, foreach, for_loop")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_adam_reference.py: no CUDA device visible to PyTorch")
    device = torch.device(args.device)
    copy = copy_gbps(device)
    results, errors = [], []
    for count in (int(s) for s in args.params.split(",")):
        sizes = model_like_sizes(count)
        for run in args.runs.split(","):
            name, variant = run.split(":")
            try:
                row = measure(name, variant, sizes, device, args.steps,
                              args.repeats)
            except (RuntimeError, TypeError, ValueError) as error:
                # e.g. a variant this PyTorch does not implement
                errors.append({"optimizer": name, "variant": variant,
                               "params": count, "error": str(error)})
                print(f"{run} at {count}: {error}", file=sys.stderr)
                continue
            row["copy_fraction"] = row["gbps"] / copy
            results.append(row)
            print(f"measured {run} at {count}: {row['step_ms']:.4f} ms",
                  file=sys.stderr)
    print(json.dumps({
        "host": socket.gethostname(), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device), "copy_gbps": copy,
        "results": results, "errors": errors}))


if __name__ == "__main__":
    main()
