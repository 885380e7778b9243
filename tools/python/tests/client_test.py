"""The Python client (mpilearn.client, python3 -m mpilearn) against a real
mpilearn-master on a free loopback port with a temporary --state_dir: jobs,
the queue, the version check, studies, TLS and tokens.

JobsTest needs only the Master service. StudiesTest needs the master to
serve the Studies service (proto/study.proto); against a master without it
every StudiesTest case fails with UNIMPLEMENTED, by design: that is the
answer a client gets from such a master, and this test should not pass
there. No worker group runs, so trial jobs stay QUEUED and the external
optimizer's verdicts (tell) decide every trial.

The master is started once, and only its pid is killed at the end; a
watchdog ends the process if anything hangs.
"""

import faulthandler
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

import grpc
import yaml

from cli_runner import run_cli
import mpilearn
from mpilearn import Client
from mpilearn import MpiLearnError

RUNFILES = os.getcwd()  # tests/run_python.sh runs us from the runfiles root.
MASTER = os.path.join(RUNFILES, "server", "mpilearn-master")
JOB_SPEC = os.path.join(RUNFILES, "docs", "examples", "fashion_mnist.json")
STUDY_SPEC = os.path.join(RUNFILES, "docs", "examples",
                          "opt_fashion_mnist.yaml")
TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()

_master = None  # subprocess.Popen of the master
_address = None


def setUpModule():
    global _master, _address
    faulthandler.dump_traceback_later(50, exit=True)
    port_file = os.path.join(TMP, "port")
    log_path = os.path.join(TMP, "master.log")
    with open(log_path, "wb") as log:
        _master = subprocess.Popen([
            MASTER, "--listen", "127.0.0.1:0", "--port_file", port_file,
            "--metrics_listen", "127.0.0.1:0", "--state_dir",
            os.path.join(TMP, "state")
        ], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            break
        if _master.poll() is not None:
            raise RuntimeError("mpilearn-master exited at startup; see " +
                               log_path)
        time.sleep(0.1)
    else:
        raise RuntimeError("mpilearn-master wrote no port file in 30 s")
    with open(port_file) as f:
        _address = "127.0.0.1:%s" % f.read().strip()
    print("master pid %d on %s" % (_master.pid, _address), file=sys.stderr)


def tearDownModule():
    if _master is not None and _master.poll() is None:
        _master.kill()
        _master.wait(timeout=30)
    faulthandler.cancel_dump_traceback_later()


def _cli(*args):
    """Runs python3 -m mpilearn; returns (exit status, stdout + stderr)."""
    status, out, err = run_cli(*args)
    return status, out + err


class JobsTest(unittest.TestCase):

    def setUp(self):
        self.client = Client(_address, timeout=10)

    def tearDown(self):
        self.client.close()

    def test_submit_status_list(self):
        job_id = self.client.submit(JOB_SPEC)  # a JSON file's path
        self.assertRegex(job_id, r"^job-\d+$")
        status = self.client.status(job_id)
        self.assertEqual(status["job_id"], job_id)
        self.assertEqual(status["state"], "JOB_STATE_QUEUED")
        self.assertEqual(status["spec"]["name"], "fashion-mnist-mlp")
        self.assertEqual(status["spec"]["batch_size"], 64)
        self.assertEqual(status["spec"]["model"]["hidden"], [256, 128])
        self.assertEqual(status["epochs_done"], 0)  # defaults are present
        self.assertEqual(status["history"], [])

        with open(JOB_SPEC) as f:
            spec = json.load(f)
        spec["name"] = "from-a-dict"
        spec["batch_size"] = 32
        second = self.client.submit(spec)
        self.assertNotEqual(second, job_id)
        self.assertEqual(self.client.status(second)["spec"]["batch_size"], 32)

        listed = {j["job_id"]: j for j in self.client.list_jobs()}
        self.assertIn(job_id, listed)
        self.assertEqual(listed[second]["spec"]["name"], "from-a-dict")
        self.assertEqual(listed[second]["state"], "JOB_STATE_QUEUED")

    def test_submit_yaml(self):
        with open(JOB_SPEC) as f:
            spec = json.load(f)
        spec["name"] = "from-yaml"
        path = os.path.join(TMP, "job.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(spec, f)
        job_id = self.client.submit(path)
        self.assertEqual(self.client.status(job_id)["spec"]["name"],
                         "from-yaml")

    def test_watch_job_yields_at_once(self):
        job_id = self.client.submit(JOB_SPEC)
        watch = self.client.watch_job(job_id, interval=0.1)
        first = next(watch)  # a queued job never ends here: take one, stop
        watch.close()
        self.assertEqual(first["job_id"], job_id)
        self.assertEqual(first["state"], "JOB_STATE_QUEUED")

    def test_unknown_job_is_not_found(self):
        with self.assertRaises(MpiLearnError) as caught:
            self.client.status("job-999999")
        e = caught.exception
        self.assertEqual(e.code, grpc.StatusCode.NOT_FOUND)
        self.assertEqual(e.code_name, "NOT_FOUND")
        self.assertIn("unknown job 'job-999999'", e.message)
        self.assertEqual(e.reason, "ERROR_REASON_JOB_UNKNOWN")
        self.assertEqual(e.method, "GetJobStatus")
        with self.assertRaises(MpiLearnError) as caught:
            next(self.client.watch_job("job-999999"))
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_master_refuses_bad_spec(self):
        with open(JOB_SPEC) as f:
            spec = json.load(f)
        spec["epochs"] = 0
        with self.assertRaises(MpiLearnError) as caught:
            self.client.submit(spec)
        e = caught.exception
        self.assertEqual(e.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("epochs", e.message)
        self.assertEqual(e.reason, "ERROR_REASON_INVALID_REQUEST")

    def test_local_spec_errors(self):
        malformed = os.path.join(TMP, "malformed.json")
        with open(malformed, "w") as f:
            f.write('{"name": "broken", "epochs": ')
        cases = [
            (malformed, "not valid JSON"),
            (os.path.join(TMP, "no-such-spec.json"), "cannot read spec"),
            ({"name": "x", "no_such_field": 1}, "no_such_field"),
            ({"epochs": "many"}, "epochs"),
            (42, "must be a dict or a file path"),
        ]
        for spec, pattern in cases:
            with self.subTest(spec=spec):
                with self.assertRaises(MpiLearnError) as caught:
                    self.client.submit(spec)
                self.assertEqual(caught.exception.code,
                                 grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn(pattern, caught.exception.message)
                self.assertIsNone(caught.exception.method)  # never sent

    def test_unreachable_master(self):
        # The version check on construction is the first call that fails.
        with self.assertRaises(MpiLearnError) as caught:
            Client("127.0.0.1:1", timeout=3)
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(caught.exception.method, "GetServerInfo")
        self.assertIn("cannot reach mpilearn-master at 127.0.0.1:1",
                      caught.exception.message)
        with Client("127.0.0.1:1", timeout=3, check_version=False) as client:
            with self.assertRaises(MpiLearnError) as caught:
                client.list_jobs()
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("cannot reach mpilearn-master at 127.0.0.1:1",
                      caught.exception.message)

    def test_server_info_and_version(self):
        info = self.client.server_info()
        # The same build: the master's release is this package's.
        self.assertEqual(info["version"], mpilearn.__version__)
        self.assertRegex(mpilearn.__version__, r"^\d+\.\d+\.\d+")
        # A master without tokens: no name, every caller an admin.
        self.assertEqual(info["caller"], "")
        self.assertEqual(info["role"], "admin")
        self.assertEqual(self.client.check_version(), info)
        rc, out = _cli("--master", _address, "version")
        self.assertEqual(rc, 0, out)
        self.assertEqual(
            out.splitlines(),
            ["client  %s (mpilearn)" % mpilearn.__version__,
             "master  %s at %s" % (info["version"], _address),
             "caller  - (role admin)"])

    def test_queue_in_priority_order(self):
        with open(JOB_SPEC) as f:
            spec = json.load(f)
        spec["name"] = "queued-low"
        low = self.client.submit(spec)
        spec["name"] = "queued-high"
        spec["priority"] = 7
        high = self.client.submit(spec)
        queued = self.client.queue()
        ids = [job["job_id"] for job in queued]
        self.assertLess(ids.index(high), ids.index(low))
        self.assertEqual([job["queue_position"] for job in queued],
                         list(range(1, len(queued) + 1)))
        self.assertTrue(
            all(job["state"] == "JOB_STATE_QUEUED" for job in queued))
        # The CLI's table: one row per queued job, in the same order.
        rc, out = _cli("--master", _address, "queue")
        self.assertEqual(rc, 0, out)
        lines = out.splitlines()
        self.assertRegex(lines[0], r"^POS +JOB +OWNER +PRIORITY +STUDY +NAME")
        self.assertEqual([line.split()[1] for line in lines[1:]], ids)
        self.assertRegex(out, r"\n\d+ +%s +- +7 +- +queued-high\n" % high)
        rc, out = _cli("--master", _address, "queue", "--json")
        self.assertEqual(rc, 0, out)
        self.assertEqual([j["job_id"] for j in json.loads(out)["jobs"]], ids)
        # jobs (or list): tab-separated id, state, name and owner ("-"
        # without tokens).
        for command in ("jobs", "list"):
            rc, out = _cli("--master", _address, command, "--state", "queued")
            self.assertEqual(rc, 0, out)
            self.assertIn("%s\tQUEUED\tqueued-high\t-\n" % high, out)

    def test_cli_usage_and_unreachable(self):
        rc, out = _cli("--master", "127.0.0.1:1", "--timeout", "3", "status")
        self.assertEqual(rc, 1, out)
        self.assertIn("cannot reach mpilearn-master at 127.0.0.1:1", out)
        rc, out = _cli("--master", _address)
        self.assertEqual(rc, 2, out)
        self.assertIn("missing command", out)
        rc, out = _cli("--master", _address, "plots", "s-1")
        self.assertEqual(rc, 2, out)
        self.assertIn("--out", out)
        rc, out = _cli("--master", "127.0.0.1:1", "--timeout", "3", "version")
        self.assertEqual(rc, 1, out)
        self.assertIn("cannot reach mpilearn-master at 127.0.0.1:1", out)


def _study_spec():
    with open(STUDY_SPEC) as f:
        spec = yaml.safe_load(f)
    spec["name"] = "client-test"
    spec["sampler"] = "external"
    spec["trials"] = 3
    return spec


GOOD_PARAMS = {
    "optimizer.learning_rate": 0.001,
    "batch_size": 64,
    "model.hidden": [256, 128],
    "model.dropout": 0.25,
}


class StudiesTest(unittest.TestCase):
    """Needs the Studies service: UNIMPLEMENTED on a master without it."""

    def setUp(self):
        self.client = Client(_address, timeout=10)

    def tearDown(self):
        self.client.close()

    def test_create_from_yaml_file(self):
        study_id = self.client.create_study(STUDY_SPEC)
        self.assertRegex(study_id, r"^s-\d+$")
        status = self.client.get_study(study_id)
        self.assertEqual(status["spec"]["name"], "fashion-mnist-mlp-search")
        self.assertEqual(status["spec"]["sampler"], "tpe")
        self.assertEqual(status["spec"]["trials"], 16)
        self.assertEqual(
            [p["path"] for p in status["spec"]["parameters"]],
            ["optimizer.learning_rate", "batch_size", "model.hidden",
             "model.dropout"])
        self.client.cancel_study(study_id, reason="test done")

    def test_ask_tell_external(self):
        study_id = self.client.create_study(_study_spec())
        status = self.client.get_study(study_id)
        self.assertEqual(status["state"], "STUDY_STATE_RUNNING")
        self.assertEqual(status["trials"], [])
        self.assertEqual(status["spec"]["objective"]["metric"],
                         "val_accuracy")
        self.assertEqual(status["spec"]["objective"]["direction"], "maximize")
        self.assertNotIn("best_value", status)  # optional, unset

        listed = {s["study_id"]: s for s in self.client.list_studies()}
        self.assertIn(study_id, listed)
        self.assertEqual(listed[study_id]["trials"], [])  # listings: none

        # The external sampler proposes nothing: params are required.
        with self.assertRaises(MpiLearnError) as caught:
            self.client.ask(study_id)
        self.assertEqual(caught.exception.code,
                         grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("params", caught.exception.message)
        out_of_range = dict(GOOD_PARAMS, **{"optimizer.learning_rate": 5.0})
        with self.assertRaises(MpiLearnError) as caught:
            self.client.ask(study_id, out_of_range)
        self.assertEqual(caught.exception.code,
                         grpc.StatusCode.INVALID_ARGUMENT)

        # Trial 0: its job is the base spec with the values applied.
        trial = self.client.ask(study_id, GOOD_PARAMS)
        self.assertEqual(trial["number"], 0)
        self.assertTrue(trial["asked"])
        self.assertIn(trial["state"],
                      ("TRIAL_STATE_QUEUED", "TRIAL_STATE_RUNNING"))
        self.assertEqual(trial["params"]["batch_size"], 64)
        self.assertEqual(trial["params"]["model.hidden"], [256, 128])
        job = self.client.status(trial["job_id"])
        # Named after the study's id (server/opt/study_table.h).
        self.assertEqual(job["spec"]["name"], "%s/trial-0" % study_id)
        self.assertEqual(job["spec"]["batch_size"], 64)
        self.assertAlmostEqual(job["spec"]["optimizer"]["learning_rate"],
                               0.001)
        self.assertAlmostEqual(job["spec"]["model"]["dropout"], 0.25)

        # Completing needs a value: the trial has none (no group trains).
        with self.assertRaises(MpiLearnError) as caught:
            self.client.tell(study_id, trial, "COMPLETED")
        self.assertEqual(caught.exception.code,
                         grpc.StatusCode.INVALID_ARGUMENT)
        done = self.client.tell(study_id, trial, "COMPLETED", value=0.75)
        self.assertEqual(done["state"], "TRIAL_STATE_COMPLETED")
        self.assertEqual(done["value"], 0.75)
        with self.assertRaises(MpiLearnError) as caught:
            self.client.tell(study_id, 0, "PRUNED")
        self.assertEqual(caught.exception.code,
                         grpc.StatusCode.FAILED_PRECONDITION)

        # Trial 1 pruned with a value, trial 2 cancelled.
        second = self.client.ask(study_id,
                                 dict(GOOD_PARAMS, batch_size=128))
        pruned = self.client.tell(study_id, second["number"],
                                  "TRIAL_STATE_PRUNED", value=0.5)
        self.assertEqual(pruned["state"], "TRIAL_STATE_PRUNED")
        third = self.client.ask(study_id, dict(GOOD_PARAMS, batch_size=96))
        cancelled = self.client.cancel_trial(study_id, third, reason="test")
        self.assertEqual(cancelled["state"], "TRIAL_STATE_CANCELLED")
        self.assertIn("test", cancelled["message"])

        # The budget of 3 trials is spent.
        with self.assertRaises(MpiLearnError) as caught:
            self.client.ask(study_id, GOOD_PARAMS)
        self.assertEqual(caught.exception.code,
                         grpc.StatusCode.FAILED_PRECONDITION)

        status = self.client.get_study(study_id)
        self.assertEqual(len(status["trials"]), 3)
        self.assertEqual(status["best_trial"], 0)
        self.assertEqual(status["best_value"], 0.75)

        # The command line on the same study.
        rc, out = _cli("--master", _address, "status", study_id)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"(?m)^study +%s$" % study_id)
        self.assertRegex(out, r"(?m)^0 +COMPLETED +0\.7500 ")
        rc, out = _cli("--master", _address, "status", study_id, "--json")
        self.assertEqual(rc, 0, out)
        self.assertEqual(json.loads(out)["study_id"], study_id)
        rc, out = _cli("--master", _address, "status")
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"(?m)^%s +client-test +" % study_id)
        plot_dir = os.path.join(TMP, "plots")
        rc, out = _cli("--master", _address, "plots", study_id, "--out",
                       plot_dir)
        self.assertEqual(rc, 0, out)
        paths = out.split()
        self.assertEqual(len(paths), 4, out)
        for path in paths:
            with open(path, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n", path)

    def test_watch_until_cancelled(self):
        study_id = self.client.create_study(_study_spec())
        trial = self.client.ask(study_id, GOOD_PARAMS)
        watch = self.client.watch_study(study_id)
        first = next(watch)
        self.assertEqual(first["kind"], "KIND_SNAPSHOT")
        self.assertEqual(first["trial"]["number"], trial["number"])
        ended = self.client.cancel_study(study_id, reason="watch test")
        self.assertEqual(ended["state"], "STUDY_STATE_CANCELLED")
        self.assertEqual(ended["trials"][0]["state"], "TRIAL_STATE_CANCELLED")
        kinds = [event["kind"] for event in watch]  # ends by itself
        self.assertEqual(kinds[-1], "KIND_STUDY_ENDED")
        self.assertIn("KIND_ENDED", kinds)
        with self.assertRaises(MpiLearnError) as caught:
            self.client.cancel_study(study_id)
        self.assertEqual(caught.exception.code,
                         grpc.StatusCode.FAILED_PRECONDITION)

    def test_unknown_study_is_not_found(self):
        for call in (lambda: self.client.get_study("s-999"),
                     lambda: self.client.ask("s-999", GOOD_PARAMS),
                     lambda: next(self.client.watch_study("s-999"))):
            with self.assertRaises(MpiLearnError) as caught:
                call()
            self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
            self.assertIn("unknown study 's-999'", caught.exception.message)
            self.assertEqual(caught.exception.reason,
                             "ERROR_REASON_STUDY_UNKNOWN")

    def test_bad_study_spec(self):
        spec = _study_spec()
        spec["parameters"][0]["real"]["low"] = -1.0  # log range needs > 0
        with self.assertRaises(MpiLearnError) as caught:
            self.client.create_study(spec)
        self.assertEqual(caught.exception.code,
                         grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("parameters", caught.exception.message)
        with self.assertRaises(MpiLearnError) as caught:
            self.client.create_study(dict(_study_spec(), sampler=7))
        self.assertEqual(caught.exception.code,
                         grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIsNone(caught.exception.method)  # refused locally


_READER_TOKEN = "reader-token-0123456789abcdef"
_ADMIN_TOKEN = "admin-token-0123456789abcdef"
_OWNER_TOKEN = "owner-token-0123456789abcdef"


class TlsAndTokensTest(unittest.TestCase):
    """A second master with TLS (certificates made with the openssl CLI, as
    docs/security.md shows) and a tokens file."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(dir=TMP)
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
               "-nodes"]

        def openssl(*args):
            subprocess.run(["openssl"] + list(args), cwd=cls.dir, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem",
                "-days", "2", "-subj", "/CN=test CA")
        openssl("req", *key, "-keyout", "server.key", "-out", "server.csr",
                "-subj", "/CN=localhost")
        with open(os.path.join(cls.dir, "server.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey",
                "ca.key", "-CAcreateserial", "-days", "2", "-extfile",
                "server.ext", "-out", "server.pem")
        with open(os.path.join(cls.dir, "tokens.txt"), "w") as f:
            f.write("admin alice %s\nreader dash %s\nowner bob %s\n" %
                    (_ADMIN_TOKEN, _READER_TOKEN, _OWNER_TOKEN))
        cls.ca = os.path.join(cls.dir, "ca.pem")
        port_file = os.path.join(cls.dir, "port")
        cls.log = os.path.join(cls.dir, "master.log")
        with open(cls.log, "wb") as log:
            cls.master = subprocess.Popen([
                MASTER, "--listen", "127.0.0.1:0", "--port_file", port_file,
                "--metrics_listen=", "--state_dir",
                os.path.join(cls.dir, "state"), "--tls_cert",
                os.path.join(cls.dir, "server.pem"), "--tls_key",
                os.path.join(cls.dir, "server.key"), "--tokens_file",
                os.path.join(cls.dir, "tokens.txt")
            ], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and
                   os.path.getsize(port_file) > 0):
            if cls.master.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the TLS master did not start; see " +
                                   cls.log)
            time.sleep(0.1)
        with open(port_file) as f:
            cls.address = "127.0.0.1:%s" % f.read().strip()

    @classmethod
    def tearDownClass(cls):
        if cls.master.poll() is None:
            cls.master.kill()
            cls.master.wait(timeout=30)

    def test_token_and_role_are_checked(self):
        with Client(self.address, timeout=10, tls_ca=self.ca,
                    token=_READER_TOKEN) as reader:
            self.assertEqual(reader.list_studies(), [])
            with self.assertRaises(MpiLearnError) as refused:
                reader.submit(JOB_SPEC)
            self.assertEqual(refused.exception.code,
                             grpc.StatusCode.PERMISSION_DENIED)
            self.assertEqual(refused.exception.reason,
                             "ERROR_REASON_PERMISSION")
        # Without a token the version check on construction is refused.
        with self.assertRaises(MpiLearnError) as refused:
            Client(self.address, timeout=10, tls_ca=self.ca, token="")
        self.assertEqual(refused.exception.code,
                         grpc.StatusCode.UNAUTHENTICATED)
        with Client(self.address, timeout=10, tls_ca=self.ca, token="",
                    check_version=False) as anonymous:
            with self.assertRaises(MpiLearnError) as refused:
                anonymous.list_studies()
            self.assertEqual(refused.exception.code,
                             grpc.StatusCode.UNAUTHENTICATED)
        with Client(self.address, timeout=10, tls_ca=self.ca,
                    token=_ADMIN_TOKEN) as admin:
            job_id = admin.submit(JOB_SPEC)
            self.assertTrue(job_id.startswith("job-"))

    def test_server_info_names_the_token_and_owner_lists_its_jobs(self):
        for token, name, role in ((_READER_TOKEN, "dash", "reader"),
                                  (_OWNER_TOKEN, "bob", "owner"),
                                  (_ADMIN_TOKEN, "alice", "admin")):
            with Client(self.address, timeout=10, tls_ca=self.ca,
                        token=token) as client:
                info = client.server_info()
                self.assertEqual((info["caller"], info["role"]), (name, role))
                self.assertEqual(info["version"], mpilearn.__version__)
        with Client(self.address, timeout=10, tls_ca=self.ca,
                    token=_OWNER_TOKEN) as owner:
            job_id = owner.submit(JOB_SPEC)
            self.assertEqual(owner.status(job_id)["spec"]["owner"], "bob")
            queued = {job["job_id"]: job for job in owner.queue()}
            self.assertEqual(queued[job_id]["spec"]["owner"], "bob")
        status, output = self._cli_with(_OWNER_TOKEN, "version")
        self.assertEqual(status, 0, output)
        self.assertIn("caller  bob (role owner)\n", output)
        status, output = self._cli_with(_OWNER_TOKEN, "list")
        self.assertEqual(status, 0, output)
        self.assertIn("%s\tQUEUED\tfashion-mnist-mlp\tbob\n" % job_id, output)

    def test_token_from_the_environment(self):
        os.environ["MPILEARN_TOKEN"] = _READER_TOKEN
        try:
            with Client(self.address, timeout=10, tls_ca=self.ca) as client:
                self.assertEqual(client.list_studies(), [])
        finally:
            del os.environ["MPILEARN_TOKEN"]

    def test_plaintext_client_cannot_talk_to_the_tls_port(self):
        with self.assertRaises(MpiLearnError) as refused:
            Client(self.address, timeout=3, token=_READER_TOKEN)
        self.assertEqual(refused.exception.code, grpc.StatusCode.UNAVAILABLE)
        with Client(self.address, timeout=3, token=_READER_TOKEN,
                    check_version=False) as client:
            with self.assertRaises(MpiLearnError) as refused:
                client.list_studies()
            self.assertEqual(refused.exception.code,
                             grpc.StatusCode.UNAVAILABLE)

    def _cli_with(self, token, *args):
        """The CLI against this master with --tls_ca and `token` in a
        --token_file."""
        token_file = os.path.join(self.dir, "%s.token" % token[:6])
        with open(token_file, "w") as f:
            f.write(token + "\n")
        return _cli("--master", self.address, "--tls_ca", self.ca,
                    "--token_file", token_file, *args)

    def test_cli_takes_tls_ca_and_token_file(self):
        status, output = self._cli_with(_READER_TOKEN, "status")
        self.assertEqual(status, 0, output)
        self.assertIn("no studies", output)


if __name__ == "__main__":
    unittest.main(verbosity=2)
