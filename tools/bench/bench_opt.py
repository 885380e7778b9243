#!/usr/bin/python3
"""bench_opt: MPI Opt (TPE + ASHA on the master) against Optuna 3.1
(TPESampler + SuccessiveHalvingPruner driving the same MPI Learn jobs by
ask/tell through the Python client), in one run, on the same search space,
trial budget, data and worker groups.

For each seed, a fresh master and two `mpirun -np 1 mpilearn-worker --serve`
groups run the study twice: once with the master's own sampler and pruner,
once with Optuna as the external sampler (docs/examples/optuna_ask_tell.py,
polling every 0.2 s, the study table's own refresh period). Figures per side:
best validation accuracy reached (best over every trial's validations),
epochs trained, worker time (the groups' seconds on the study's jobs, from
their telemetry), wall time, trials, pruned trials. Then the
trial throughput of MPI Opt with 1 and with 2 groups (first seed).

    bazel run -c opt //tools:bench_opt -- [--seeds 1,2,3] [--trials 16] [--json]

Prints a table and ratios (MPI Opt / Optuna), or with --json one object:
{"mpi_opt": {best_accuracy, epochs_trained, worker_s, wall_s, trials, pruned},
 "optuna": {same}, "ratios": {...}, "throughput": {...}, "per_seed": [...]}
where mpi_opt and optuna hold the medians over the seeds.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def find_root():
    """The directory holding server/, worker/, tools/, docs/ (runfiles or checkout)."""
    runfiles = os.environ.get("RUNFILES_DIR") or (sys.argv[0] + ".runfiles")
    for candidate in (os.path.join(runfiles, "mpilearn"), os.path.join(HERE, os.pardir, os.pardir)):
        if os.path.exists(os.path.join(candidate, "worker", "mpilearn-worker")):
            return os.path.abspath(candidate)
    sys.exit("bench_opt: mpilearn-worker not found; run it with bazel run //tools:bench_opt")


ROOT = find_root()
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from mpilearn import Client  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def study_spec(seed, trials, epochs, train):
    return {
        "name": "bench-opt",
        "base": {
            "model": {"name": "mlp", "hidden": [256, 128]},
            "data": {
                "train_images": DATA + "/train-images-idx3-ubyte.gz",
                "train_labels": DATA + "/train-labels-idx1-ubyte.gz",
                "test_images": DATA + "/t10k-images-idx3-ubyte.gz",
                "test_labels": DATA + "/t10k-labels-idx1-ubyte.gz",
                "train_limit": train,
                "validation_count": 2000,
                "test_limit": 1000,
            },
            "optimizer": {"name": "adam", "learning_rate": 0.001},
            "algorithm": "downpour",
            "epochs": epochs,
            "batch_size": 64,
            "seed": seed,
        },
        "parameters": [
            {"path": "optimizer.learning_rate",
             "real": {"low": 0.0001, "high": 0.03, "log": True}},
            {"path": "batch_size", "int": {"low": 32, "high": 256, "step": 32}},
            {"path": "model.hidden",
             "categorical": {"choices": [[128], [256, 128], [512, 256]]}},
            {"path": "model.dropout", "real": {"low": 0.0, "high": 0.5}},
        ],
        "objective": {"metric": "val_accuracy"},
        "sampler": "tpe",
        "trials": trials,
        "parallelism": 2,
        "pruner": {"name": "asha", "min_resource": 1, "reduction_factor": 2},
        "seed": seed,
    }


class Cluster:
    """A master on a free loopback port and N serving groups; stopped on exit."""

    def __init__(self, work, groups):
        self.work = work
        self.procs = []
        state = os.path.join(work, "state")
        port_file = os.path.join(work, "port")
        self.master = subprocess.Popen(
            [os.path.join(ROOT, "server", "mpilearn-master"), "--listen", "127.0.0.1:0",
             "--port_file", port_file, "--state_dir", state, "--metrics_listen="],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "master.log"), "w"))
        self.procs.append(self.master)
        for _ in range(100):
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                break
            time.sleep(0.1)
        else:
            self.stop()
            sys.exit("bench_opt: the master did not start; see " + work + "/master.log")
        with open(port_file) as f:
            self.address = "127.0.0.1:" + f.read().strip()
        mpi = ["mpirun", "--oversubscribe"]
        if os.geteuid() == 0:
            mpi.append("--allow-run-as-root")
        for g in range(groups):
            self.procs.append(subprocess.Popen(
                mpi + ["-np", "1", os.path.join(ROOT, "worker", "mpilearn-worker"),
                       "--master", self.address, "--serve", "--threads=1",
                       "--progress=off", "--serve_poll_s=0.2"],
                stdout=open(os.path.join(work, "group-%d.log" % g), "w"),
                stderr=subprocess.STDOUT))

    def stop(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def worker_seconds(client, status):
    """Seconds the groups spent on the study's jobs, from the jobs' telemetry
    (each group's wall time since it registered, as last reported)."""
    total = 0.0
    for trial in status.get("trials", []):
        for job_id in trial.get("job_ids", []):
            for group in client.status(job_id).get("groups", []):
                total += group.get("telemetry", {}).get("wall_seconds", 0.0)
    return round(total, 2)


def figures_of(client, status, wall_s):
    trials = status.get("trials", [])
    return {
        "best_accuracy": status.get("best_value", 0.0),
        "epochs_trained": status.get("epochs_trained", 0),
        "worker_s": worker_seconds(client, status),
        "wall_s": round(wall_s, 2),
        "trials": len(trials),
        "pruned": sum(1 for t in trials if t["state"] == "TRIAL_STATE_PRUNED"),
    }


def run_mpi_opt(work, spec, groups):
    cluster = Cluster(work, groups)
    try:
        client = Client(cluster.address)
        start = time.monotonic()
        study_id = client.create_study(spec)
        while True:
            status = client.get_study(study_id)
            if status["state"] != "STUDY_STATE_RUNNING":
                break
            time.sleep(0.2)
        return figures_of(client, status, time.monotonic() - start)
    finally:
        cluster.stop()


def run_optuna(work, spec, trials):
    cluster = Cluster(work, 2)
    try:
        spec_path = os.path.join(work, "study.json")
        out = os.path.join(work, "optuna.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        script = os.path.join(ROOT, "docs", "examples", "optuna_ask_tell.py")
        subprocess.run(
            ["/usr/bin/python3", script, "--master", cluster.address, "--trials",
             str(trials), "--parallel", "2", "--base", spec_path,
             "--interval", "0.2", "--out", out],
            check=True, stdout=open(os.path.join(work, "optuna.log"), "w"),
            stderr=subprocess.STDOUT)
        with open(out) as f:
            result = json.load(f)
        client = Client(cluster.address)
        figures = figures_of(client, client.get_study(result["study_id"]),
                             result["wall_s"])
        # The script counts what Optuna pruned (told PRUNED to the master).
        figures["pruned"] = result["pruned"]
        figures["trials"] = result["trials"]
        return figures
    finally:
        cluster.stop()


def median_of(runs):
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3",
                        help="comma-separated study seeds, one run of each side per seed")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train", type=int, default=6000,
                        help="training images per trial (Fashion-MNIST subset)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not os.path.exists(DATA + "/train-images-idx3-ubyte.gz"):
        sys.exit("bench_opt: needs Debian's dataset-fashion-mnist (tools/install_deps.sh)")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    work = tempfile.mkdtemp(prefix="mpilearn-bench_opt.")
    per_seed = []
    try:
        for seed in seeds:
            spec = study_spec(seed, args.trials, args.epochs, args.train)
            for side in ("mpi_opt", "optuna"):
                os.makedirs(os.path.join(work, "%s-%d" % (side, seed)))
            mine = run_mpi_opt(os.path.join(work, "mpi_opt-%d" % seed), spec, 2)
            theirs = run_optuna(os.path.join(work, "optuna-%d" % seed), spec, args.trials)
            per_seed.append({"seed": seed, "mpi_opt": mine, "optuna": theirs})
            print("seed %d: MPI Opt best %.4f in %d epochs, %.1f s; Optuna best %.4f in %d "
                  "epochs, %.1f s" % (seed, mine["best_accuracy"], mine["epochs_trained"],
                                      mine["wall_s"], theirs["best_accuracy"],
                                      theirs["epochs_trained"], theirs["wall_s"]),
                  file=sys.stderr)
        one_dir = os.path.join(work, "one-group")
        os.makedirs(one_dir)
        one = run_mpi_opt(one_dir, study_spec(seeds[0], args.trials, args.epochs,
                                              args.train), 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mine = median_of([r["mpi_opt"] for r in per_seed])
    theirs = median_of([r["optuna"] for r in per_seed])
    two = per_seed[0]["mpi_opt"]
    result = {
        "mpi_opt": mine,
        "optuna": theirs,
        "ratios": {
            "best_accuracy": round(mine["best_accuracy"] / theirs["best_accuracy"], 4),
            "epochs_trained": round(mine["epochs_trained"] / theirs["epochs_trained"], 4),
            "worker_s": round(mine["worker_s"] / theirs["worker_s"], 4),
            "wall_s": round(mine["wall_s"] / theirs["wall_s"], 4),
        },
        "throughput": {
            "groups_1_trials_per_min": round(60 * one["trials"] / one["wall_s"], 2),
            "groups_2_trials_per_min": round(60 * two["trials"] / two["wall_s"], 2),
            "groups_1_epochs_per_min": round(60 * one["epochs_trained"] / one["wall_s"], 2),
            "groups_2_epochs_per_min": round(60 * two["epochs_trained"] / two["wall_s"], 2),
        },
        "seeds": seeds,
        "per_seed": per_seed,
    }
    t = result["throughput"]
    t["speedup_2_vs_1_groups"] = round(
        t["groups_2_epochs_per_min"] / t["groups_1_epochs_per_min"], 4)
    if args.json:
        print(json.dumps(result))
        return
    print("median over seeds %s, %d trials of up to %d epochs on %d images"
          % (args.seeds, args.trials, args.epochs, args.train))
    print("%-10s %14s %15s %9s %8s %7s %7s" % ("", "best_val_acc", "epochs_trained",
                                                "worker_s", "wall_s", "trials",
                                                "pruned"))
    for name, row in (("MPI Opt", mine), ("Optuna", theirs)):
        print("%-10s %14.4f %15d %9.1f %8.1f %7d %7d" % (
            name, row["best_accuracy"], row["epochs_trained"], row["worker_s"],
            row["wall_s"], row["trials"], row["pruned"]))
    r = result["ratios"]
    print("MPI Opt / Optuna: best accuracy %.4fx, epochs trained %.4fx, worker time "
          "%.4fx, wall %.4fx" % (r["best_accuracy"], r["epochs_trained"],
                                 r["worker_s"], r["wall_s"]))
    print("MPI Opt throughput: 1 group %.1f epochs/min, 2 groups %.1f epochs/min "
          "(%.2fx)" % (t["groups_1_epochs_per_min"], t["groups_2_epochs_per_min"],
                       t["speedup_2_vs_1_groups"]))


if __name__ == "__main__":
    main()
