"""docs/examples/optuna_ask_tell.py: its search-space mapping onto Optuna's
suggest_* calls, and a whole run: a real mpilearn-master, two real worker
groups (`mpirun -np 1 mpilearn-worker --serve`) and the script, whose
results JSON must agree with the master's own account of the study.

The run needs Fashion-MNIST under /usr/share/datasets/fashion-mnist
(dataset-fashion-mnist); without it that case is skipped. Every process
started is killed by its pid at the end; a watchdog bounds the whole test.
"""

import faulthandler
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

import optuna
import yaml

from mpilearn import Client

RUNFILES = os.getcwd()  # tests/run_python.sh runs us from the runfiles root.
SCRIPT = os.path.join(RUNFILES, "docs", "examples", "optuna_ask_tell.py")
MASTER = os.path.join(RUNFILES, "server", "mpilearn-master")
WORKER = os.path.join(RUNFILES, "worker", "mpilearn-worker")
DATA = "/usr/share/datasets/fashion-mnist"
TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()

_spec = importlib.util.spec_from_file_location("optuna_ask_tell", SCRIPT)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

HIDDEN = [[64], [256, 128]]
STUDY = {
    "name": "optuna-test",
    "base": {
        "model": {"name": "mlp", "hidden": [256, 128]},
        "data": {
            "train_images": DATA + "/train-images-idx3-ubyte.gz",
            "train_labels": DATA + "/train-labels-idx1-ubyte.gz",
            "test_images": DATA + "/t10k-images-idx3-ubyte.gz",
            "test_labels": DATA + "/t10k-labels-idx1-ubyte.gz",
            "train_limit": 3000,
            "validation_count": 500,
            "test_limit": 500,
        },
        "optimizer": {"name": "adam", "learning_rate": 0.001},
        "algorithm": "downpour",
        "epochs": 4,
        "batch_size": 64,
    },
    "parameters": [
        {"path": "optimizer.learning_rate",
         "real": {"low": 1e-4, "high": 3e-2, "log": True}},
        {"path": "batch_size", "int": {"low": 32, "high": 128, "step": 32}},
        {"path": "model.hidden", "categorical": {"choices": HIDDEN}},
        {"path": "algorithm",
         "categorical": {"choices": ["downpour", "easgd"]}},
    ],
    "objective": {"metric": "val_accuracy"},
    "sampler": "tpe",
    "trials": 99,
    "pruner": {"name": "asha", "min_resource": 1, "reduction_factor": 2},
    "seed": 3,
}


class SearchSpaceTest(unittest.TestCase):

    def test_study_spec_from_replaces_the_driver_fields(self):
        path = os.path.join(TMP, "study.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(STUDY, f)
        doc, spec = example.study_spec_from(path, trials=5, parallel=3)
        self.assertEqual(doc["pruner"]["name"], "asha")  # for Optuna's
        self.assertEqual(spec["sampler"], "external")
        self.assertEqual(spec["trials"], 5)
        self.assertEqual(spec["parallelism"], 3)
        self.assertEqual(spec["pruner"], {"name": "none"})
        self.assertEqual(spec["parameters"], STUDY["parameters"])

        job = os.path.join(TMP, "job.json")
        with open(job, "w") as f:
            json.dump(dict(STUDY["base"], name="plain"), f)
        _, spec = example.study_spec_from(job, trials=2, parallel=1)
        self.assertEqual(spec["name"], "plain-optuna")
        self.assertEqual(spec["base"]["name"], "plain")
        self.assertEqual(spec["parameters"], example.DEFAULT_PARAMETERS)

    def test_suggest_stays_in_the_space(self):
        study = optuna.create_study(
            direction="maximize", sampler=optuna.samplers.TPESampler(seed=1))
        seen_hidden = set()
        for i in range(30):
            trial = study.ask()
            params = example.suggest(trial, STUDY["parameters"])
            self.assertEqual(sorted(params),
                             sorted(p["path"] for p in STUDY["parameters"]))
            lr = params["optimizer.learning_rate"]
            self.assertTrue(1e-4 <= lr <= 3e-2, lr)
            self.assertIn(params["batch_size"], (32, 64, 96, 128))
            self.assertIsInstance(params["batch_size"], int)
            self.assertIn(params["model.hidden"], HIDDEN)  # a list again
            self.assertIn(params["algorithm"], ("downpour", "easgd"))
            seen_hidden.add(tuple(params["model.hidden"]))
            study.tell(trial, float(i))
        self.assertEqual(seen_hidden, {(64,), (256, 128)})


class _Processes:
    """Children started by the test, killed by pid on close."""

    def __init__(self):
        self.children = []

    def start(self, argv, log_name):
        log = open(os.path.join(TMP, log_name), "wb")
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.children.append(child)
        return child

    def close(self):
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)


@unittest.skipUnless(os.path.isdir(DATA),
                     DATA + " absent: install dataset-fashion-mnist")
class EndToEndTest(unittest.TestCase):

    def setUp(self):
        self.processes = _Processes()
        self.addCleanup(self.processes.close)

    def logs(self):
        text = []
        for name in sorted(os.listdir(TMP)):
            if name.endswith(".log"):
                with open(os.path.join(TMP, name), errors="replace") as f:
                    text.append("--- %s ---\n%s" % (name, f.read()[-3000:]))
        return "\n".join(text)

    def test_optuna_drives_a_study(self):
        port_file = os.path.join(TMP, "port")
        master = self.processes.start([
            MASTER, "--listen", "127.0.0.1:0", "--port_file", port_file,
            "--metrics_listen", "127.0.0.1:0", "--state_dir",
            os.path.join(TMP, "state")
        ], "master.log")
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and os.path.getsize(port_file)):
            self.assertIsNone(master.poll(), self.logs())
            self.assertLess(time.monotonic(), deadline, self.logs())
            time.sleep(0.1)
        with open(port_file) as f:
            address = "127.0.0.1:" + f.read().strip()

        # Open MPI's session directory and shared memory in the test's own
        # directory (see tests/test_process.cc).
        os.environ["TMPDIR"] = TMP
        os.environ["OMPI_MCA_btl_vader_backing_directory"] = TMP
        for g in range(2):
            self.processes.start([
                "mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                "1", WORKER, "--master=" + address, "--serve", "--threads=1",
                "--exit_when_idle_s=60", "--progress=off"
            ], "group-%d.log" % g)

        base = os.path.join(TMP, "e2e.yaml")
        with open(base, "w") as f:
            yaml.safe_dump(STUDY, f)
        out = os.path.join(TMP, "results.json")
        run = subprocess.run([
            sys.executable, "-B", SCRIPT, "--master", address, "--trials",
            "6", "--parallel", "2", "--base", base, "--out", out,
            "--interval", "0.2"
        ], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=200,
                             check=False)
        self.assertEqual(run.returncode, 0,
                         run.stdout.decode() + "\n" + self.logs())
        with open(out) as f:
            result = json.load(f)
        self.assertEqual(
            set(result), {"best_accuracy", "epochs_trained", "wall_s",
                          "trials", "pruned", "study_id"})
        self.assertEqual(result["trials"], 6)

        # The master's account of the same study.
        with Client(address, timeout=10) as client:
            status = client.get_study(result["study_id"])
        self.assertEqual(status["state"], "STUDY_STATE_COMPLETED",
                         status.get("message"))
        self.assertEqual(status["spec"]["sampler"], "external")
        trials = status["trials"]
        self.assertEqual(len(trials), 6)
        self.assertTrue(all(t["asked"] for t in trials))
        self.assertEqual(result["best_accuracy"], status["best_value"])
        self.assertEqual(
            result["best_accuracy"],
            max(t["value"] for t in trials
                if t["state"] in ("TRIAL_STATE_COMPLETED",
                                  "TRIAL_STATE_PRUNED")))
        self.assertTrue(0.3 < result["best_accuracy"] <= 1.0, result)
        self.assertEqual(result["epochs_trained"], status["epochs_trained"])
        self.assertEqual(result["epochs_trained"],
                         sum(t["epochs_trained"] for t in trials))
        by_optuna = [t for t in trials
                     if "SuccessiveHalvingPruner" in t.get("message", "")]
        self.assertEqual(result["pruned"], len(by_optuna))
        for t in trials:
            self.assertIn(t["state"],
                          ("TRIAL_STATE_COMPLETED", "TRIAL_STATE_PRUNED"), t)
            if t["state"] == "TRIAL_STATE_COMPLETED":
                self.assertEqual(t["epochs_done"], 4, t)
                # The value is the best intermediate value.
                self.assertEqual(t["value"],
                                 max(iv["value"] for iv in t["intermediate"]))
            else:
                self.assertIn(t, by_optuna)
        self.assertGreater(result["wall_s"], 0.0)


if __name__ == "__main__":
    faulthandler.dump_traceback_later(280, exit=True)
    unittest.main(verbosity=2)
