#!/usr/bin/python3
"""Optuna 3.1 drives an MPI Learn study through the master's RPC (ask/tell).

Optuna chooses each trial's parameters (TPESampler) and decides pruning
(SuccessiveHalvingPruner); MPI Learn trains the trials: the study is created
with sampler "external", each Optuna trial becomes an MPI Learn trial by
AskTrial (its job goes to the master's queue, where any worker group started
with --serve trains it), every validation the job records is reported to
Optuna at its epoch, and a trial Optuna prunes is told PRUNED, which stops
its job. --parallel trials are in flight at once; one polling loop (no
threads) follows them all.

    bazel-bin/server/mpilearn-master --listen 127.0.0.1:7070 &
    mpirun -np 2 bazel-bin/worker/mpilearn-worker --master 127.0.0.1:7070 --serve &
    tools/python/gen_stubs.sh        # once, in a checkout
    /usr/bin/python3 docs/examples/optuna_ask_tell.py --master 127.0.0.1:7070 \
        --trials 16 --parallel 2 --out optuna_results.json

--base is a study spec (JSON or YAML, like opt_fashion_mnist.yaml: its base
job, parameters, objective, seed and asha pruner settings are used; its
sampler, trials and parallelism are replaced by "external", --trials and
--parallel) or a plain job spec (JSON), searched over the same four
parameters as opt_fashion_mnist.yaml. --out gets
{"best_accuracy", "epochs_trained", "wall_s", "trials", "pruned"} plus
"study_id" (//tools:bench_opt reads it as the Optuna side): best_accuracy
is the master's best value (COMPLETED and PRUNED trials, as MPI Opt ranks
them), epochs_trained every epoch the trials' jobs trained.
"""

import argparse
import json
import os
import sys
import time

try:
    import mpilearn  # noqa: F401  (PYTHONPATH=tools/python)
except ImportError:
    # Beside the client in a checkout or Bazel's runfiles:
    # docs/examples/ and tools/python/ share the root.
    sys.path.insert(
        0,
        os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                     os.pardir, "tools", "python"))
from mpilearn import Client  # noqa: E402
from mpilearn import MpiLearnError  # noqa: E402
from mpilearn.client import STUDY_ENDED_STATES  # noqa: E402
from mpilearn.client import load_document  # noqa: E402

import optuna  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))

# The search space for a plain job spec: opt_fashion_mnist.yaml's.
DEFAULT_PARAMETERS = [
    {"path": "optimizer.learning_rate",
     "real": {"low": 0.0001, "high": 0.03, "log": True}},
    {"path": "batch_size", "int": {"low": 32, "high": 256, "step": 32}},
    {"path": "model.hidden",
     "categorical": {"choices": [[128], [256, 128], [512, 256]]}},
    {"path": "model.dropout", "real": {"low": 0.0, "high": 0.5}},
]


def log(message):
    print("[optuna_ask_tell %s] %s" % (time.strftime("%H:%M:%S"), message),
          file=sys.stderr, flush=True)


def study_spec_from(path, trials, parallel):
    doc = load_document(path)
    if "base" in doc and "parameters" in doc:
        spec = dict(doc)
    else:
        spec = {"name": doc.get("name", "job") + "-optuna", "base": doc,
                "parameters": DEFAULT_PARAMETERS}
    spec["sampler"] = "external"
    spec["trials"] = trials
    spec["parallelism"] = parallel
    spec["name"] = spec.get("name", "study")
    # Optuna prunes; the master's own pruner would fight it.
    spec["pruner"] = {"name": "none"}
    spec.pop("tpe", None)
    return doc, spec


def _scalar(value):
    return value is None or isinstance(value, (bool, int, float, str))


def suggest(trial, parameters):
    """The MPI Learn params of an Optuna trial: one suggest_* per parameter.
    Categorical choices that are not scalars (lists such as model.hidden)
    go to Optuna as their JSON text and come back decoded."""
    params = {}
    for p in parameters:
        path = p["path"]
        if "real" in p:
            r = p["real"]
            params[path] = trial.suggest_float(path, float(r["low"]),
                                               float(r["high"]),
                                               log=bool(r.get("log", False)),
                                               step=r.get("step"))
        elif "int" in p:
            r = p["int"]
            params[path] = trial.suggest_int(path, int(r["low"]),
                                             int(r["high"]),
                                             step=int(r.get("step", 1)),
                                             log=bool(r.get("log", False)))
        else:
            choices = p["categorical"]["choices"]
            if all(_scalar(c) for c in choices):
                params[path] = trial.suggest_categorical(path, choices)
            else:
                text = trial.suggest_categorical(
                    path, [json.dumps(c, sort_keys=True) for c in choices])
                params[path] = json.loads(text)
    return params


class InFlight:
    """An MPI Learn trial and its Optuna twin, with the epochs reported."""

    def __init__(self, optuna_trial, number):
        self.optuna_trial = optuna_trial
        self.number = number
        self.reported = set()

    def report_new(self, trial):
        """Reports the trial's new intermediate values to Optuna, by epoch."""
        for iv in sorted(trial.get("intermediate", []),
                         key=lambda iv: iv.get("epoch", 0)):
            epoch = int(iv.get("epoch", 0))
            if epoch not in self.reported:
                self.optuna_trial.report(float(iv["value"]), epoch)
                self.reported.add(epoch)


def run(args):
    doc, spec = study_spec_from(args.base, args.trials, args.parallel)
    objective = spec.get("objective") or {}
    metric = objective.get("metric") or "val_accuracy"
    direction = (objective.get("direction") or
                 ("maximize" if metric == "val_accuracy" else "minimize"))
    asha = doc.get("pruner") or {}
    if asha.get("name") != "asha":
        asha = {}
    pruner = optuna.pruners.SuccessiveHalvingPruner(
        min_resource=int(asha.get("min_resource", 1)),
        reduction_factor=int(asha.get("reduction_factor", 4)),
        min_early_stopping_rate=int(asha.get("min_early_stopping_rate", 0)))
    seed = args.seed if args.seed is not None else int(spec.get("seed", 1))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=direction,
                                sampler=optuna.samplers.TPESampler(seed=seed),
                                pruner=pruner)

    client = Client(args.master, timeout=30)
    start = time.monotonic()
    study_id = client.create_study(spec)
    log("study %s on %s: %d trials, %d at once, %s %s" %
        (study_id, args.master, args.trials, args.parallel, direction,
         metric))
    in_flight = {}  # MPI Learn trial number -> InFlight
    asked = 0
    pruned = 0
    try:
        while True:
            while len(in_flight) < args.parallel and asked < args.trials:
                optuna_trial = study.ask()
                params = suggest(optuna_trial, spec["parameters"])
                trial = client.ask(study_id, params)
                in_flight[trial["number"]] = InFlight(optuna_trial,
                                                      trial["number"])
                asked += 1
                log("trial %d: job %s, %s" %
                    (trial["number"], trial["job_id"],
                     json.dumps(params, sort_keys=True)))
            if not in_flight:
                break
            time.sleep(args.interval)
            status = client.get_study(study_id)
            for trial in status.get("trials", []):
                flight = in_flight.get(trial["number"])
                if flight is None:
                    continue
                flight.report_new(trial)
                state = trial.get("state", "")
                ot = flight.optuna_trial
                if state == "TRIAL_STATE_COMPLETED":
                    study.tell(ot, float(trial["value"]))
                    log("trial %d completed: %s %.4f after %d epochs" %
                        (trial["number"], metric, trial["value"],
                         trial.get("epochs_done", 0)))
                elif state in ("TRIAL_STATE_QUEUED", "TRIAL_STATE_RUNNING"):
                    if not flight.reported or not ot.should_prune():
                        continue
                    client.tell(study_id, trial["number"], "PRUNED",
                                message="pruned by Optuna's "
                                "SuccessiveHalvingPruner at epoch %d" %
                                max(flight.reported))
                    study.tell(ot, state=optuna.trial.TrialState.PRUNED)
                    pruned += 1
                    log("trial %d pruned at epoch %d" %
                        (trial["number"], max(flight.reported)))
                elif state == "TRIAL_STATE_PRUNED" and flight.reported:
                    study.tell(ot, state=optuna.trial.TrialState.PRUNED)
                    pruned += 1
                else:  # FAILED, CANCELLED (or pruned before any value)
                    study.tell(ot, state=optuna.trial.TrialState.FAIL)
                    log("trial %d ended %s: %s" %
                        (trial["number"], state, trial.get("message", "")))
                del in_flight[trial["number"]]
            if status.get("state") in STUDY_ENDED_STATES and in_flight:
                log("study ended (%s): %s" %
                    (status.get("state"), status.get("message", "")))
                for flight in in_flight.values():
                    study.tell(flight.optuna_trial,
                               state=optuna.trial.TrialState.FAIL)
                in_flight.clear()
                break
    except KeyboardInterrupt:
        log("interrupted: cancelling study %s" % study_id)
        client.cancel_study(study_id, reason="optuna_ask_tell interrupted")
        raise
    wall_s = time.monotonic() - start

    # Every trial is told: the master completes the study at its next
    # refresh (the budget is spent). Cancel it if that takes too long, or if
    # the loop stopped short of the budget.
    deadline = time.monotonic() + 10.0
    status = client.get_study(study_id)
    while (status.get("state") == "STUDY_STATE_RUNNING" and
           time.monotonic() < deadline):
        time.sleep(0.2)
        status = client.get_study(study_id)
    if status.get("state") == "STUDY_STATE_RUNNING":
        try:
            status = client.cancel_study(study_id, reason="optuna done")
        except MpiLearnError:
            status = client.get_study(study_id)
    result = {
        "best_accuracy": status.get("best_value"),
        "epochs_trained": int(status.get("epochs_trained", 0)),
        "wall_s": wall_s,
        "trials": asked,
        "pruned": pruned,
        "study_id": study_id,
    }
    log("done: %s" % json.dumps(result, sort_keys=True))
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master",
                        default=os.environ.get("MPILEARN_MASTER",
                                               "127.0.0.1:7070"),
                        help="host:port of mpilearn-master")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=2,
                        help="trials in flight at once (default 2)")
    parser.add_argument("--base",
                        default=os.path.join(_HERE, "opt_fashion_mnist.yaml"),
                        help="a study spec (JSON/YAML) or a job spec (JSON)")
    parser.add_argument("--seed", type=int, default=None,
                        help="TPESampler seed (default: the spec's, else 1)")
    parser.add_argument("--interval", type=float, default=1.0,
                        help="seconds between polls of the study")
    parser.add_argument("--out", default=None,
                        help="write the results JSON here")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.parallel < 1:
        parser.error("--trials and --parallel must be at least 1")
    try:
        result = run(args)
    except MpiLearnError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
