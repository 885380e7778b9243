"""Replays a pruning scenario through Optuna 3.1 and prints its decisions.

The reference that //server/opt:pruner_test compares our pruners with. Run
with Debian's /usr/bin/python3 (optuna 3.1). Reads one JSON object on stdin:

  {"pruner": {"name": "asha", "min_resource": 1, "reduction_factor": 2,
              "min_early_stopping_rate": 0},
   "events": [{"trial": 0, "epoch": 1, "value": 3.5},
              {"trial": 1, "epoch": 1, "value": NaN},
              {"trial": 0, "complete": true}, ...]}

("median" takes "startup_trials" and "warmup_epochs"; a missing setting
takes the PrunerSpec default.) Trials are asked from one minimizing study in
the order of their first event, so several are open at once. A report event
calls trial.report(value, step=epoch) then trial.should_prune(); a pruned
trial is told PRUNED and its later events are skipped, as the study table
stops its job. A complete event tells the trial COMPLETE (with value 0: the
pruners read only intermediate values and states). Prints on stdout

  {"decisions": [[trial, epoch, pruned], ...]}

one entry per report event that was replayed, in order.
"""

import json
import sys
import warnings

import optuna


def make_pruner(spec):
    name = spec.get("name", "") or "none"
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=spec.get("min_resource", 1),
            reduction_factor=spec.get("reduction_factor", 4),
            min_early_stopping_rate=spec.get("min_early_stopping_rate", 0),
        )
    if name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=spec.get("startup_trials", 5),
            n_warmup_steps=spec.get("warmup_epochs", 0),
            interval_steps=1,
        )
    raise ValueError("unknown pruner %r" % name)


def replay(scenario):
    study = optuna.create_study(
        direction="minimize",
        pruner=make_pruner(scenario.get("pruner", {})),
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    open_trials = {}  # scenario trial id -> optuna.trial.Trial
    ended = set()  # pruned or completed
    decisions = []
    for event in scenario["events"]:
        key = event["trial"]
        if key in ended:
            continue
        if key not in open_trials:
            open_trials[key] = study.ask()
        trial = open_trials[key]
        if event.get("complete", False):
            study.tell(trial, 0.0)
            ended.add(key)
            continue
        epoch = event["epoch"]
        trial.report(float(event["value"]), step=epoch)
        pruned = bool(trial.should_prune())  # MedianPruner gives numpy.bool_
        decisions.append([key, epoch, pruned])
        if pruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            ended.add(key)
    return decisions


def main():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # np.nanmin of an all-NaN curve warns; the NaN it returns is the point.
    warnings.simplefilter("ignore", RuntimeWarning)
    scenario = json.load(sys.stdin)
    json.dump({"decisions": replay(scenario)}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
