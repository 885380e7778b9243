"""Runs Optuna 3.1's TPESampler and RandomSampler on an analytic objective.

The reference that //server/opt:sampler_test compares our TPE sampler with.
Run with Debian's /usr/bin/python3 (optuna 3.1):

  optuna_tpe_reference.py --objective=xy --seeds=16 --trials=60

For each seed 0 .. seeds - 1 it runs one minimizing study of `trials`
sequential trials with TPESampler(seed=seed) (Optuna's defaults: 10 startup
trials, 24 EI candidates, univariate) and one with RandomSampler(seed=seed),
and prints one JSON object on stdout:

  {"tpe_median_best": 0.0123, "random_median_best": 0.234,
   "tpe_best": [...], "random_best": [...]}

the median over seeds of each study's best value, and the per-seed bests.

Objectives (the C++ test defines the same ones):
  xy:      x uniform in [-2, 2], y log-uniform in [1e-5, 1];
           f = (x - 0.3)^2 + (log10(y) + 2.5)^2
  catint:  c categorical of 5 choices, n int in [0, 60] step 2, x uniform
           in [-1, 1]; f = [0.8, 0.3, 0.0, 0.5, 1.2][c] + ((n - 24) / 10)^2
           + x^2
"""

import argparse
import json
import math
import statistics
import warnings

import optuna

CAT_OFFSETS = [0.8, 0.3, 0.0, 0.5, 1.2]


def xy_objective(trial):
    x = trial.suggest_float("x", -2.0, 2.0)
    y = trial.suggest_float("y", 1e-5, 1.0, log=True)
    return (x - 0.3) ** 2 + (math.log10(y) + 2.5) ** 2


def catint_objective(trial):
    c = trial.suggest_categorical("c", [0, 1, 2, 3, 4])
    n = trial.suggest_int("n", 0, 60, step=2)
    x = trial.suggest_float("x", -1.0, 1.0)
    return CAT_OFFSETS[c] + ((n - 24) / 10.0) ** 2 + x**2


OBJECTIVES = {"xy": xy_objective, "catint": catint_objective}


def best_of(sampler, objective, trials):
    study = optuna.create_study(direction="minimize", sampler=sampler)
    study.optimize(objective, n_trials=trials)
    return study.best_value


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--objective", choices=sorted(OBJECTIVES), default="xy")
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--trials", type=int, default=60)
    args = parser.parse_args()

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore")
    objective = OBJECTIVES[args.objective]
    tpe = [
        best_of(optuna.samplers.TPESampler(seed=s), objective, args.trials)
        for s in range(args.seeds)
    ]
    rnd = [
        best_of(optuna.samplers.RandomSampler(seed=s), objective, args.trials)
        for s in range(args.seeds)
    ]
    print(
        json.dumps(
            {
                "tpe_median_best": statistics.median(tpe),
                "random_median_best": statistics.median(rnd),
                "tpe_best": tpe,
                "random_best": rnd,
            }
        )
    )


if __name__ == "__main__":
    main()
