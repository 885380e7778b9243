"""Runs Optuna 3.1's NSGAIISampler and RandomSampler on an analytic
two-objective function: the reference //server/opt:nsga2_test compares our
NSGA-II with. Run with Debian's /usr/bin/python3 (optuna 3.1):

  optuna_nsga2_reference.py --seeds=8 --trials=200 --population=20

For each seed 0 .. seeds - 1 it runs one study of `trials` sequential trials
with NSGAIISampler(population_size=population, seed=seed) (its other
defaults: uniform crossover with probability 0.9, swapping 0.5, mutation
1 / parameters) and one with RandomSampler(seed=seed), and prints one JSON
object on stdout: the hypervolume of each study's Pareto front (both
objectives minimized, reference point (1, 10)), per seed and their means:

  {"nsga2_mean": 8.1, "random_mean": 6.9, "nsga2": [...], "random": [...]}

The function (the C++ test defines the same one), ZDT1 of 6 variables
x0 .. x5 uniform in [0, 1]: f1 = x0, g = 1 + 9 mean(x1 .. x5),
f2 = g (1 - sqrt(f1 / g)). Its Pareto front (g = 1) has hypervolume 9.667.
"""

import argparse
import json
import statistics
import warnings

import optuna

REFERENCE = (1.0, 10.0)
VARIABLES = 6


def objective(trial):
    x = [trial.suggest_float(f"x{i}", 0.0, 1.0) for i in range(VARIABLES)]
    g = 1 + 9 * sum(x[1:]) / (VARIABLES - 1)
    return x[0], g * (1 - (x[0] / g) ** 0.5)


def hypervolume(points):
    """The area the points dominate up to REFERENCE (both minimized)."""
    inside = sorted(p for p in points if p[0] < REFERENCE[0] and p[1] < REFERENCE[1])
    area = 0.0
    ceiling = REFERENCE[1]
    for f1, f2 in inside:
        if f2 < ceiling:
            area += (REFERENCE[0] - f1) * (ceiling - f2)
            ceiling = f2
    return area


def run(sampler, trials):
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    study.optimize(objective, n_trials=trials)
    return hypervolume([tuple(t.values) for t in study.best_trials])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--population", type=int, default=20)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    nsga2 = [run(optuna.samplers.NSGAIISampler(population_size=args.population, seed=s),
                 args.trials) for s in range(args.seeds)]
    rand = [run(optuna.samplers.RandomSampler(seed=s), args.trials) for s in range(args.seeds)]
    print(json.dumps({"nsga2_mean": statistics.mean(nsga2), "random_mean": statistics.mean(rand),
                      "nsga2": nsga2, "random": rand}))


if __name__ == "__main__":
    main()
