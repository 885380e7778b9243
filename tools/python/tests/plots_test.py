"""mpilearn.plots on a hand-built StudyStatus: the four PNGs are written
(non-empty, PNG signature), from the message and from its dict, also for a
study without trials; and parameter_importance equals Spearman's rank
correlation computed by hand (the textbook 1 - 6 sum d^2 / (n (n^2 - 1))
formula, exact when there are no ties, and average ranks for ties).
"""

import copy
import faulthandler
import math
import os
import tempfile
import unittest

from google.protobuf import json_format

from mpilearn import plots
from mpilearn._stubs import study_pb2

TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Five trials over a real (log), an int and a categorical parameter:
#   trial  lr      batch  hidden      state      value  intermediate
#   0      0.001   32     [128]       COMPLETED  0.80   .70 .75 .80
#   1      0.01    64     [256,128]   COMPLETED  0.85   .72 .80 .85
#   2      0.0001  128    [128]       PRUNED     0.60   .60
#   3      0.003   256    [512,256]   COMPLETED  0.90   .75 .88 .90
#   4      0.03    96     [256,128]   PRUNED     0.70   .65 .70
#   5      0.002   64     [128]       RUNNING    -      (none)
STATUS = {
    "study_id": "s-7",
    "state": "STUDY_STATE_RUNNING",
    "spec": {
        "name": "hand-built",
        "objective": {"metric": "val_accuracy", "direction": "maximize"},
        "sampler": "tpe",
        "trials": 8,
        "parameters": [
            {"path": "optimizer.learning_rate",
             "real": {"low": 1e-4, "high": 0.03, "log": True}},
            {"path": "batch_size", "int": {"low": 32, "high": 256}},
            {"path": "model.hidden",
             "categorical": {"choices": [[128], [256, 128], [512, 256]]}},
        ],
    },
    "trials": [],
    "best_trial": 3,
    "best_value": 0.9,
}
_ROWS = [
    (0.001, 32, [128], "COMPLETED", 0.80, [0.70, 0.75, 0.80]),
    (0.01, 64, [256, 128], "COMPLETED", 0.85, [0.72, 0.80, 0.85]),
    (0.0001, 128, [128], "PRUNED", 0.60, [0.60]),
    (0.003, 256, [512, 256], "COMPLETED", 0.90, [0.75, 0.88, 0.90]),
    (0.03, 96, [256, 128], "PRUNED", 0.70, [0.65, 0.70]),
    (0.002, 64, [128], "RUNNING", None, []),
]
for _n, (_lr, _bs, _hidden, _state, _value, _iv) in enumerate(_ROWS):
    _trial = {
        "number": _n,
        "state": "TRIAL_STATE_" + _state,
        "params": {"optimizer.learning_rate": _lr, "batch_size": _bs,
                   "model.hidden": _hidden},
        "intermediate": [{"epoch": e + 1, "value": v}
                         for e, v in enumerate(_iv)],
        "epochs_done": len(_iv),
    }
    if _value is not None:
        _trial["value"] = _value
    STATUS["trials"].append(_trial)


def _textbook_spearman(x, y):
    """1 - 6 sum d^2 / (n (n^2 - 1)) with ranks by sorting (no ties)."""
    n = len(x)
    rank_x = {v: i + 1 for i, v in enumerate(sorted(x))}
    rank_y = {v: i + 1 for i, v in enumerate(sorted(y))}
    d2 = sum((rank_x[a] - rank_y[b]) ** 2 for a, b in zip(x, y))
    return 1.0 - 6.0 * d2 / (n * (n * n - 1))


class PlotsTest(unittest.TestCase):

    def check_pngs(self, paths, want_names):
        self.assertEqual([os.path.basename(p) for p in paths], want_names)
        for path in paths:
            with open(path, "rb") as f:
                data = f.read()
            self.assertGreater(len(data), 1000, path)
            self.assertEqual(data[:8], PNG_SIGNATURE, path)

    def test_save_study_plots_from_message_and_dict(self):
        message = json_format.ParseDict(STATUS, study_pb2.StudyStatus())
        names = ["s-7-history.png", "s-7-intermediate.png",
                 "s-7-parallel_coordinates.png", "s-7-importance.png"]
        self.check_pngs(
            plots.save_study_plots(message, os.path.join(TMP, "message")),
            names)
        self.check_pngs(
            plots.save_study_plots(STATUS, os.path.join(TMP, "dict")), names)

    def test_pareto_front_of_a_study_of_two_objectives(self):
        status = copy.deepcopy(STATUS)
        status["study_id"] = "s-8"
        status["spec"]["objectives"] = [
            {"metric": "val_accuracy", "direction": "maximize"},
            {"metric": "parameters", "direction": "minimize"}]
        sizes = {0: 1000, 1: 3000, 3: 9000}
        for trial in status["trials"]:
            if trial["number"] in sizes:
                trial["values"] = [trial["value"], sizes[trial["number"]]]
        status["pareto_front"] = [0, 1, 3]
        self.assertEqual(plots.pareto_front(status),
                         [(0, [0.8, 1000.0]), (1, [0.85, 3000.0]), (3, [0.9, 9000.0])])
        paths = plots.save_study_plots(status, os.path.join(TMP, "front"))
        self.check_pngs(paths, ["s-8-history.png", "s-8-intermediate.png",
                                "s-8-parallel_coordinates.png", "s-8-importance.png",
                                "s-8-pareto_front.png"])

    def test_k_fold_study_draws_each_mean_with_its_spread(self):
        status = copy.deepcopy(STATUS)
        status["spec"]["folds"] = 3
        for trial in status["trials"]:
            if "value" in trial and trial["number"] != 4:
                trial["value_spread"] = 0.01 * (trial["number"] + 1)
        self.assertEqual(plots.fold_spreads(status),
                         [(0, 0.80, 0.01), (1, 0.85, 0.02), (2, 0.60, 0.03),
                          (3, 0.90, 0.04)])
        message = json_format.ParseDict(status, study_pb2.StudyStatus())
        self.assertEqual(plots.fold_spreads(message)[3], (3, 0.90, 0.04))
        path = plots.plot_history(status, os.path.join(TMP, "folds-history.png"))
        self.check_pngs([path], ["folds-history.png"])
        self.assertEqual(plots.fold_spreads(STATUS), [])

    def test_empty_study(self):
        empty = {"study_id": "s-1", "spec": STATUS["spec"], "trials": []}
        self.check_pngs(
            plots.save_study_plots(empty, os.path.join(TMP, "empty")),
            ["s-1-history.png", "s-1-intermediate.png",
             "s-1-parallel_coordinates.png", "s-1-importance.png"])
        self.assertEqual(plots.parameter_importance(empty),
                         {"optimizer.learning_rate": 0.0, "batch_size": 0.0,
                          "model.hidden": 0.0})

    def test_importance_against_hand_computed(self):
        importance = plots.parameter_importance(STATUS)
        self.assertEqual(list(importance),
                         ["optimizer.learning_rate", "batch_size",
                          "model.hidden"])
        # Trials with a value: 0..4 (trial 5 runs, no value).
        values = [0.80, 0.85, 0.60, 0.90, 0.70]
        # learning rate ranks 2 4 1 3 5 vs value ranks 3 4 1 5 2:
        # d = -1 0 0 -2 3, sum d^2 = 14, rho = 1 - 84 / 120 = 0.3.
        lrs = [0.001, 0.01, 0.0001, 0.003, 0.03]
        self.assertAlmostEqual(_textbook_spearman(lrs, values), 0.3, 12)
        self.assertAlmostEqual(importance["optimizer.learning_rate"], 0.3, 12)
        # batch 32 64 128 256 96: ranks 1 2 4 5 3, d = -2 -2 3 0 1,
        # sum d^2 = 18, rho = 1 - 108 / 120 = 0.1.
        self.assertAlmostEqual(importance["batch_size"], 0.1, 12)
        # hidden by choice index 0 1 0 2 1: ties. Average ranks 1.5 3.5 1.5
        # 5 3.5 against 3 4 1 5 2; centred (-1.5 .5 -1.5 2 .5) and
        # (0 1 -2 2 -1): dot 0 + .5 + 3 + 4 - .5 = 7, norms^2 9 and 10,
        # rho = 7 / sqrt(90).
        self.assertAlmostEqual(importance["model.hidden"],
                               7.0 / math.sqrt(90.0), 12)

    def test_spearman_sign_and_degenerate_cases(self):
        self.assertAlmostEqual(plots.spearman([1, 2, 3, 4], [10, 20, 25, 99]),
                               1.0, 12)
        self.assertAlmostEqual(plots.spearman([1, 2, 3, 4], [4, 3, 2, 1]),
                               -1.0, 12)
        self.assertEqual(plots.spearman([1, 1, 1], [1, 2, 3]), 0.0)
        self.assertEqual(plots.spearman([1], [2]), 0.0)
        with self.assertRaises(ValueError):
            plots.spearman([1, 2], [1])

    def test_objective_defaults(self):
        self.assertEqual(plots.objective_of({}), ("val_accuracy", True))
        self.assertEqual(
            plots.objective_of({"spec": {"objective": {"metric": "val_loss"}}}),
            ("val_loss", False))
        self.assertEqual(
            plots.objective_of({"spec": {"objective": {
                "metric": "val_mae", "direction": "maximize"}}}),
            ("val_mae", True))


if __name__ == "__main__":
    faulthandler.dump_traceback_later(120, exit=True)
    unittest.main(verbosity=2)
