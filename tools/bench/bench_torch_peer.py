#!/usr/bin/python3
"""The PyTorch peer of bench_scaling: the built-in MLP or CNN trained on the
same Fashion-MNIST split by a plain PyTorch loop in one process, or by
DistributedDataParallel (gloo) over loopback, one compute thread per process.
Run it with Debian's /usr/bin/python3 (python3-torch 1.13, CPU).

    /usr/bin/python3 tools/bench/bench_torch_peer.py --model cnn --train 20000 \
        [--ranks 1|2] [--epochs 1] [--validation_count 2000] [--batch 64] \
        [--lr 0.001] [--seed 1] [--data_unit_size 2048]

The models mirror worker/model/model.cc with their defaults (no dropout, no batch
norm): mlp is flatten, dense 256, relu, dense 128, relu, dense 10; cnn is
conv 3x3 'same' 32, relu, max pool 2, conv 3x3 'same' 64, relu, max pool 2,
flatten, dense 128, relu, dense 10. Like the worker: uint8 pixels scaled by
1/255, the first `--train` of the first train + validation_count training
images trained and the next validation_count held out, cross entropy on
the logits, Adam with the job spec's default rate (common/spec/job_spec.cc:
1e-3, betas 0.9/0.999, eps 1e-8).

Same seed, same run: the initial weights come from torch.manual_seed(seed)
(as the worker's, drawn layer by layer in the same order), and every epoch
trains in the worker's order (epoch_batches: the epoch's permutation of
docs/protocol.md, seeded seed * 1000003 + epoch, cut into data units of
--data_unit_size, the spec's data_unit_size). So the plain loop computes
what `mpilearn-worker --local` computes, and DDP what a `sync` group of
as many ranks does, up to float rounding: their test accuracies are a
paired comparison, not two draws of the data order. (After one short
epoch the order alone moves the MLP's test accuracy by about a point, SD
over seeds.)

--ranks 1 is a plain loop. --ranks N > 1 starts N copies of this script as
DistributedDataParallel ranks (env:// rendezvous on a free loopback port);
each trains its share of every data unit with `--batch` per rank, the
group's mean gradient per step.

Prints one JSON object: parameters, samples, train_s and samples_per_s over
the training loop only (from the first batch to the last optimizer step;
the slowest rank's time for DDP; not the imports, data loading or
process start), and val_accuracy / test_accuracy (the full test set)
measured after the epoch. Each process computes on one thread: ATen's
intra-op and inter-op pools, OpenMP and OpenBLAS, as the worker's --threads 1.
"""

import os

# One compute thread per process, as the worker's SetComputeThreads sets
# (worker/session.cc): OpenBLAS (where Debian's torch and numpy do matrix
# products; its pthread build starts one thread per core) and OpenMP read
# these when they load, so they are set before numpy and torch are imported.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """The array in a gzip'd IDX file of unsigned bytes (its own shape)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        sys.exit(f"bench_torch_peer: {path} is not an IDX file of unsigned bytes")
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_split(data, prefix, limit):
    """(features [N, 1, 28, 28] float32 / 255, labels [N] int64), first `limit`."""
    images = read_idx(f"{data}/{prefix}-images-idx3-ubyte.gz")[:limit]
    labels = read_idx(f"{data}/{prefix}-labels-idx1-ubyte.gz")[:limit]
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return x, torch.from_numpy(labels.astype(np.int64))


def build_model(name):
    """The built-in model of worker/model/model.cc (BuildMlp / BuildCnn defaults)."""
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(28 * 28, 256), nn.ReLU(),
            nn.Linear(256, 128), nn.ReLU(),
            nn.Linear(128, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding="same"), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding="same"), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
        nn.Linear(128, 10))


def accuracy(model, x, y, batch=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for begin in range(0, len(y), batch):
            out = model(x[begin:begin + batch])
            correct += int(out.argmax(1).eq(y[begin:begin + batch]).sum())
    model.train()
    return correct / max(1, len(y))


def epoch_batches(args, epoch, rank, world):
    """Yields this rank's batches of 0-based `epoch` in the worker's order,
    each as (sample indices, the whole group's samples in that step).

    The order is the one docs/protocol.md (NextDataUnit) defines and
    worker/trainer.cc draws: LibTorch's randperm of the training samples
    with a CPU generator seeded seed * 1000003 + epoch, cut into data units
    of data_unit_size positions, taken in order. A unit of n samples gives
    rank r of `world` its positions [n r / world, n (r + 1) / world), in
    batches of `batch`, and every rank runs as many steps as the largest
    share needs (a rank past its share trains an empty batch, which DDP
    still averages in).
    """
    generator = torch.Generator().manual_seed(
        (args.seed * 1000003 + epoch) % (1 << 64))
    order = torch.randperm(args.train, generator=generator)
    for unit_begin in range(0, args.train, args.data_unit_size):
        n = min(args.train - unit_begin, args.data_unit_size)
        shares = [(unit_begin + n * r // world, unit_begin + n * (r + 1) // world)
                  for r in range(world)]
        largest_share = -(-n // world)  # ceil
        for step in range(-(-largest_share // args.batch)):
            spans = [(min(b + step * args.batch, e), min(b + (step + 1) * args.batch, e))
                     for b, e in shares]
            begin, end = spans[rank]
            yield order[begin:end], sum(e - b for b, e in spans)


def train(args, rank, world):
    """Trains one epoch as `rank` of `world`; returns the result on rank 0."""
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    x_all, y_all = load_split(args.data, "train", args.train + args.validation_count)
    x_train, y_train = x_all[:args.train], y_all[:args.train]
    x_val, y_val = x_all[args.train:], y_all[args.train:]
    model = build_model(args.model)
    parameters = sum(p.numel() for p in model.parameters())
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    loss_sum = torch.zeros((), dtype=torch.float64)
    trained = 0  # this rank's samples, all epochs
    for epoch in range(args.epochs):
        loss_sum.zero_()  # the last epoch's loss
        for index, group_samples in epoch_batches(args, epoch, rank, world):
            optimizer.zero_grad(set_to_none=True)
            x = x_train.index_select(0, index)
            y = y_train.index_select(0, index)
            # The worker's loss: the batch's summed cross entropy over the
            # group's samples in this step (DDP averages over the ranks,
            # hence * world): the group's mean gradient, whatever each
            # rank's share.
            loss = F.cross_entropy(model(x), y, reduction="sum")
            (loss * (world / group_samples)).backward()
            optimizer.step()
            loss_sum += loss.detach()
            trained += len(index)
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    samples = torch.tensor([trained], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        dist.all_reduce(samples)
        dist.all_reduce(loss_sum)
    if rank != 0:
        return None
    # Every DDP rank holds the same weights after the last step.
    plain = model.module if world > 1 else model
    x_test, y_test = load_split(args.data, "t10k", None)
    train_s = float(seconds[0])
    return {
        "model": args.model, "mode": "torch_plain" if world == 1 else "ddp",
        "ranks": world, "parameters": parameters,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "batch_size": args.batch, "epochs": args.epochs, "samples": int(samples[0]),
        "train_s": round(train_s, 4),
        "samples_per_s": round(float(samples[0]) / train_s, 3),
        "train_loss": round(float(loss_sum) / args.train, 4),
        "val_accuracy": round(accuracy(plain, x_val, y_val), 4),
        "test_accuracy": round(accuracy(plain, x_test, y_test), 4),
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(args):
    """Starts args.ranks copies of this script as DDP ranks; rank 0's JSON."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(args.ranks))
    command = [sys.executable, os.path.abspath(__file__), "--rank_of_ddp"] + sys.argv[1:]
    procs = [subprocess.Popen(command, env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, text=True)
             for r in range(args.ranks)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=args.timeout_s)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = [r for r, proc in enumerate(procs) if proc.returncode != 0]
    if failed:
        sys.exit(f"bench_torch_peer: DDP rank(s) {failed} failed")
    return json.loads(outputs[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--validation_count", type=int, default=2000)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data_unit_size", type=int, default=2048)
    parser.add_argument("--data", default=DATA)
    parser.add_argument("--timeout_s", type=float, default=1200)
    parser.add_argument("--rank_of_ddp", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if (args.ranks < 1 or args.train < args.ranks or args.batch < 1 or args.epochs < 1
            or args.data_unit_size < 1 or args.seed < 0):
        sys.exit("bench_torch_peer: needs --ranks >= 1, --train >= ranks, --batch >= 1, "
                 "--epochs >= 1, --data_unit_size >= 1 and --seed >= 0")
    if args.rank_of_ddp:
        rank = int(os.environ["RANK"])
        dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
        result = train(args, rank, args.ranks)
        dist.destroy_process_group()
    elif args.ranks > 1:
        result = run_ddp(args)
    else:
        result = train(args, 0, 1)
    if result is not None:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
