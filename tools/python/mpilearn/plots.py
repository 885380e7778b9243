"""PNG plots of an MPI Opt study, drawn with matplotlib's Agg canvas (no
display, no pyplot state, so safe in scripts, servers and threads).

    from mpilearn import Client, plots
    status = Client("127.0.0.1:7070").get_study("study-000001")
    for path in plots.save_study_plots(status, "plots/"):
        print(path)

Each function takes a StudyStatus as the dict Client.get_study returns or
as the protobuf message. A trial "has a value" when the master set its
objective (COMPLETED trials, and PRUNED ones that reported a validation).

parameter_importance is NOT fANOVA (Optuna's default importance): it is the
absolute Spearman rank correlation between each parameter and the
objective over the trials with a value. Numeric parameters enter by value
(the ranks are the same in log space), categorical ones by the index of
their choice in the spec. It sees monotone effects only: a parameter with a
sweet spot in the middle of its range can score near 0.
"""

import math
import os

import matplotlib
import numpy as np
from matplotlib import cm
from matplotlib import colors
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from mpilearn.client import to_dict

_PRUNED = "TRIAL_STATE_PRUNED"
_COMPLETED = "TRIAL_STATE_COMPLETED"


def _as_dict(status):
    return status if isinstance(status, dict) else to_dict(status)


def objective_of(status):
    """(metric, maximize) of the study, with the spec's defaults: metric
    val_accuracy, maximized for val_accuracy and minimized otherwise."""
    objective = _as_dict(status).get("spec", {}).get("objective", {})
    metric = objective.get("metric") or "val_accuracy"
    direction = (objective.get("direction") or "").lower()
    if direction in ("maximize", "minimize"):
        return metric, direction == "maximize"
    return metric, metric == "val_accuracy"


def _trials_with_value(status):
    trials = [t for t in _as_dict(status).get("trials", []) if "value" in t]
    return sorted(trials, key=lambda t: t.get("number", 0))


def _param_specs(status):
    """path -> ParameterSpec dict, in the spec's order."""
    specs = {}
    for p in _as_dict(status).get("spec", {}).get("parameters", []):
        specs[p.get("path", "")] = p
    return specs


def _param_paths(status):
    paths = list(_param_specs(status))
    for t in _as_dict(status).get("trials", []):
        for path in t.get("params", {}):
            if path not in paths:
                paths.append(path)
    return paths


def _numeric_param(spec, value, seen):
    """A parameter's value as a number: the value itself for real and int
    parameters (and any number without a spec), the index of the choice for
    categorical ones (or of its first appearance in `seen`, without a
    spec). None when absent."""
    if value is None:
        return None
    if spec is not None and "categorical" in spec:
        choices = spec["categorical"].get("choices", [])
        for i, choice in enumerate(choices):
            if choice == value:
                return float(i)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    key = repr(value)
    if key not in seen:
        seen[key] = float(len(seen))
    return seen[key]


def _param_matrix(status, trials):
    """(paths, matrix[trial][param] as floats, NaN where absent)."""
    specs = _param_specs(status)
    paths = _param_paths(status)
    matrix = np.full((len(trials), len(paths)), np.nan)
    for j, path in enumerate(paths):
        seen = {}
        for i, t in enumerate(trials):
            x = _numeric_param(specs.get(path), t.get("params", {}).get(path),
                               seen)
            if x is not None:
                matrix[i, j] = x
    return paths, matrix


def _ranks(x):
    """1-based ranks of x, ties sharing their average rank."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x, y):
    """Spearman's rank correlation of two equal-length sequences (Pearson's
    correlation of their average-tie ranks); 0 when either is constant or
    there are fewer than 2 points."""
    if len(x) != len(y):
        raise ValueError("spearman: lengths differ (%d, %d)" % (len(x), len(y)))
    if len(x) < 2:
        return 0.0
    rx = _ranks(x) - (len(x) + 1) / 2.0
    ry = _ranks(y) - (len(y) + 1) / 2.0
    denom = math.sqrt(float(np.dot(rx, rx)) * float(np.dot(ry, ry)))
    return float(np.dot(rx, ry)) / denom if denom > 0 else 0.0


def parameter_importance(status):
    """path -> |Spearman rank correlation| of the parameter with the
    objective, over the trials with a value and that parameter (see the
    module comment), in the spec's order."""
    trials = _trials_with_value(status)
    paths, matrix = _param_matrix(status, trials)
    values = np.array([t["value"] for t in trials], dtype=np.float64)
    importance = {}
    for j, path in enumerate(paths):
        present = ~np.isnan(matrix[:, j])
        importance[path] = abs(spearman(matrix[present, j], values[present]))
    return importance


def _new_figure(width=8.0, height=5.0):
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _no_data(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _title(status, what):
    status = _as_dict(status)
    name = status.get("spec", {}).get("name") or status.get("study_id", "")
    return "%s: %s" % (name, what) if name else what


def fold_spreads(status):
    """A k-fold study (spec.folds): [(trial number, value, value_spread)] of
    the trials whose every fold has a value, in trial order; the value is
    the folds' mean and the spread their standard deviation."""
    return [(t.get("number", 0), t["value"], t["value_spread"])
            for t in _trials_with_value(status) if "value_spread" in t]


def plot_history(status, path):
    """The objective of each trial with a value (completed: dots, pruned:
    crosses) by trial number, and the best value so far (completed and
    pruned trials, as the master ranks them) as a step line. In a k-fold
    study each value is the folds' mean, drawn with a bar of +- their
    spread."""
    metric, maximize = objective_of(status)
    trials = _trials_with_value(status)
    fig, ax = _new_figure()
    ax.set_title(_title(status, "optimisation history"))
    if not trials:
        _no_data(ax, "no trial has a value yet")
    else:
        for state, marker, label in ((_COMPLETED, "o", "completed"),
                                     (_PRUNED, "x", "pruned")):
            xs = [t["number"] for t in trials if t.get("state") == state]
            ys = [t["value"] for t in trials if t.get("state") == state]
            if xs:
                ax.scatter(xs, ys, marker=marker, label=label, zorder=3)
        spreads = fold_spreads(status)
        if spreads:
            ax.errorbar([n for n, _, _ in spreads], [v for _, v, _ in spreads],
                        yerr=[e for _, _, e in spreads], fmt="none",
                        ecolor="tab:gray", capsize=3, zorder=2,
                        label="spread over folds")
        ranked = [t for t in trials if t.get("state") in (_COMPLETED, _PRUNED)]
        if ranked:
            best, xs, ys = None, [], []
            for t in ranked:
                v = t["value"]
                if best is None or (v > best if maximize else v < best):
                    best = v
                xs.append(t["number"])
                ys.append(best)
            ax.step(xs, ys, where="post", color="tab:red", label="best so far")
        ax.set_xlabel("trial")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(metric)
        ax.legend(loc="best")
        ax.grid(True, alpha=0.3)
    fig.savefig(path, format="png")
    return path


def plot_intermediate(status, path):
    """Each trial's intermediate values (the objective at each epoch), one
    line per trial; pruned trials dashed."""
    metric, _ = objective_of(status)
    trials = [t for t in _as_dict(status).get("trials", [])
              if t.get("intermediate")]
    fig, ax = _new_figure()
    ax.set_title(_title(status, "intermediate values"))
    if not trials:
        _no_data(ax, "no intermediate values yet")
    else:
        for t in sorted(trials, key=lambda t: t.get("number", 0)):
            points = sorted((iv.get("epoch", 0), iv.get("value", 0.0))
                            for iv in t["intermediate"])
            pruned = t.get("state") == _PRUNED
            ax.plot([p[0] for p in points], [p[1] for p in points],
                    linestyle="--" if pruned else "-", marker=".",
                    label="trial %d%s" % (t.get("number", 0),
                                          " (pruned)" if pruned else ""))
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(metric)
        if len(trials) <= 12:
            ax.legend(loc="best", fontsize="small")
        ax.grid(True, alpha=0.3)
    fig.savefig(path, format="png")
    return path


def _normalize_column(column, log):
    """Scales a column to [0, 1] (in log space for log parameters); a
    constant column maps to 0.5."""
    col = np.array(column, dtype=np.float64)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            col = np.where(col > 0, np.log(col), np.nan)
    finite = col[np.isfinite(col)]
    if finite.size == 0:
        return col
    lo, hi = finite.min(), finite.max()
    if hi == lo:
        return np.where(np.isfinite(col), 0.5, np.nan)
    return (col - lo) / (hi - lo)


def _is_log(spec):
    if spec is None:
        return False
    for kind in ("real", "int"):
        if kind in spec:
            return bool(spec[kind].get("log", False))
    return False


def plot_parallel_coordinates(status, path):
    """One polyline per trial with a value across an axis per parameter and
    one for the objective, each axis scaled to [0, 1] (log parameters in log
    space, categorical ones by choice index), colored by the objective."""
    metric, maximize = objective_of(status)
    trials = _trials_with_value(status)
    fig, ax = _new_figure(width=max(8.0, 2.0 + 1.6 * len(_param_paths(status))))
    ax.set_title(_title(status, "parallel coordinates"))
    if not trials:
        _no_data(ax, "no trial has a value yet")
    else:
        specs = _param_specs(status)
        paths, matrix = _param_matrix(status, trials)
        values = np.array([t["value"] for t in trials], dtype=np.float64)
        columns = [_normalize_column(matrix[:, j], _is_log(specs.get(p)))
                   for j, p in enumerate(paths)]
        columns.append(_normalize_column(values, False))
        grid = np.stack(columns, axis=1)
        norm = colors.Normalize(vmin=values.min(), vmax=values.max())
        colormap = matplotlib.colormaps["viridis" if maximize else "viridis_r"]
        xs = np.arange(grid.shape[1])
        # Best trials last, so they are drawn on top.
        order = np.argsort(values if maximize else -values, kind="mergesort")
        for i in order:
            ys = grid[i]
            ok = np.isfinite(ys)
            ax.plot(xs[ok], ys[ok], color=colormap(norm(values[i])),
                    alpha=0.8, marker="o", markersize=3)
        for x in xs:
            ax.axvline(x, color="gray", linewidth=0.8)
        ax.set_xticks(xs)
        ax.set_xticklabels(paths + [metric], rotation=20, ha="right",
                           fontsize="small")
        ax.set_ylim(-0.05, 1.05)
        ax.set_ylabel("normalized (log params in log space)")
        mappable = cm.ScalarMappable(norm=norm, cmap=colormap)
        fig.colorbar(mappable, ax=ax, label=metric)
        fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def plot_importance(status, path):
    """A bar per parameter: parameter_importance (|Spearman rank
    correlation| with the objective; not fANOVA)."""
    importance = parameter_importance(status)
    fig, ax = _new_figure()
    ax.set_title(_title(status, "parameter importance (rank correlation)"))
    if not importance or len(_trials_with_value(status)) < 2:
        _no_data(ax, "fewer than 2 trials with a value")
    else:
        paths = list(importance)
        ax.barh(range(len(paths)), [importance[p] for p in paths])
        ax.set_yticks(range(len(paths)))
        ax.set_yticklabels(paths, fontsize="small")
        ax.invert_yaxis()
        ax.set_xlim(0.0, 1.0)
        ax.set_xlabel("|Spearman rank correlation| with the objective")
        fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def pareto_front(status):
    """A study of several objectives: [(trial number, [values...])] of the
    trials on its Pareto front (StudyStatus.pareto_front), in trial order."""
    status = _as_dict(status)
    by_number = {t.get("number", 0): t for t in status.get("trials", [])}
    return [(n, [float(v) for v in by_number[n].get("values", [])])
            for n in status.get("pareto_front", []) if n in by_number]


def plot_pareto_front(status, path):
    """A study of several objectives: every completed trial by its first two
    objectives (grey), the Pareto front's trials marked, labelled with their
    numbers and joined in order of the first objective."""
    status = _as_dict(status)
    objectives = status.get("spec", {}).get("objectives", [])
    fig, ax = _new_figure()
    ax.set_title(_title(status, "Pareto front"))
    done = [t for t in status.get("trials", [])
            if t.get("state") == _COMPLETED and len(t.get("values", [])) >= 2]
    front = pareto_front(status)
    if len(objectives) < 2 or not done:
        _no_data(ax, "no completed trial of several objectives yet")
    else:
        ax.scatter([t["values"][0] for t in done], [t["values"][1] for t in done],
                   color="lightgrey", label="trials", zorder=2)
        front.sort(key=lambda item: item[1][0])
        xs = [values[0] for _, values in front]
        ys = [values[1] for _, values in front]
        ax.plot(xs, ys, marker="o", color="tab:red", label="Pareto front", zorder=3)
        for (number, values) in front:
            ax.annotate(str(number), (values[0], values[1]), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)

        def label(objective):
            return "%s (%s)" % (objective.get("metric", ""),
                                objective.get("direction", "minimize")[:3])
        ax.set_xlabel(label(objectives[0]))
        ax.set_ylabel(label(objectives[1]))
        if len(objectives) > 2:
            ax.text(0.99, 0.01, "first two of %d objectives" % len(objectives),
                    ha="right", va="bottom", transform=ax.transAxes, fontsize=8)
        ax.legend(loc="best")
        ax.grid(True, alpha=0.3)
    fig.savefig(path, format="png")
    return path


def save_study_plots(status, out_dir):
    """Writes the four plots as OUT_DIR/<study id>-{history, intermediate,
    parallel_coordinates, importance}.png (creating OUT_DIR), and for a
    study of several objectives -pareto_front.png too; returns their paths.
    A plot without data says so in the picture."""
    status = _as_dict(status)
    os.makedirs(out_dir, exist_ok=True)
    prefix = os.path.join(out_dir, status.get("study_id") or "study")
    paths = [
        plot_history(status, prefix + "-history.png"),
        plot_intermediate(status, prefix + "-intermediate.png"),
        plot_parallel_coordinates(status,
                                  prefix + "-parallel_coordinates.png"),
        plot_importance(status, prefix + "-importance.png"),
    ]
    if len(status.get("spec", {}).get("objectives", [])) >= 2:
        paths.append(plot_pareto_front(status, prefix + "-pareto_front.png"))
    return paths
