"""The package's version (mpilearn.__version__ from common/version.h, or
the file the build writes) and the client's version rule against fake
masters in this process: one of another major.minor, one of this major.minor
with another patch, and one from before 0.10 (no GetServerInfo: gRPC
answers UNIMPLEMENTED). Also `Client.queue()`'s order and the `mpilearn
version` and `queue` commands against them.

Each fake is a grpc.server on a free loopback port, stopped at the end.
"""

from concurrent import futures
import os
import re
import tempfile
import unittest
from unittest import mock

import grpc

from cli_runner import run_cli as _cli
import mpilearn
from mpilearn import _version
from mpilearn import Client
from mpilearn import MpiLearnError
from mpilearn import VersionMismatch
from mpilearn._stubs import mpilearn_pb2
from mpilearn._stubs import mpilearn_pb2_grpc

RUNFILES = os.getcwd()  # tests/run_python.sh runs us from the runfiles root.
TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()


def _other_patch(version):
    """`version` with another patch number: "0.10.0" -> "0.10.99"."""
    major, minor = version.split(".")[:2]
    return "%s.%s.99" % (major, minor)


def _other_minor(version):
    """`version` one minor release back (or on): "0.10.0" -> "0.9.1"."""
    major, minor = (int(n) for n in version.split(".")[:2])
    return "%d.%d.1" % (major, minor - 1 if minor > 0 else minor + 1)


def _queued(job_id, position, note=""):
    job = mpilearn_pb2.JobStatus(job_id=job_id,
                                 state=mpilearn_pb2.JOB_STATE_QUEUED,
                                 queue_position=position,
                                 queue_note=note)
    job.spec.owner = "bob"
    job.spec.name = "n-" + job_id
    return job


class _Master(mpilearn_pb2_grpc.MasterServicer):
    """Answers GetServerInfo with `version` (None: does not implement it,
    as a master before 0.10) and ListJobs with three queued jobs out of
    order."""

    def __init__(self, version):
        self.version = version

    def GetServerInfo(self, request, context):
        if self.version is None:
            return super().GetServerInfo(request, context)
        return mpilearn_pb2.ServerInfo(version=self.version, caller="bob",
                                       role="owner")

    def ListJobs(self, request, context):
        jobs = [_queued("job-000003", 2), _queued("job-000001", 0),
                _queued("job-000002", 1, note="owner bob holds 1 group")]
        jobs[0].spec.priority = 5
        return mpilearn_pb2.ListJobsResponse(jobs=jobs)


def _start(version):
    """A fake master; returns (server, "127.0.0.1:PORT")."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    mpilearn_pb2_grpc.add_MasterServicer_to_server(_Master(version), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, "127.0.0.1:%d" % port


class VersionRuleTest(unittest.TestCase):

    def test_same_major_minor(self):
        same = _version.same_major_minor
        self.assertTrue(same("0.10.0", "0.10.0"))
        self.assertTrue(same("0.10.0", "0.10.7"))
        self.assertTrue(same("0.10.0", "0.10"))
        self.assertTrue(same("1.2.0", "1.2.0-rc1"))
        self.assertTrue(same("0.10.0", "0.010.2"))  # numbers, not text
        self.assertFalse(same("0.10.0", "0.9.1"))
        self.assertFalse(same("0.10.0", "0.1.0"))  # not a prefix match
        self.assertFalse(same("0.10.0", "1.10.0"))
        for bad in ("", None, "0", "dev", "0.x.1", "-0.10.0", "0.10rc1"):
            with self.subTest(master=bad):
                self.assertFalse(same("0.10.0", bad))
        self.assertFalse(same("", ""))

    def test_version_is_common_version_h(self):
        header = os.path.join(RUNFILES, "common", "version.h")
        self.assertEqual(os.path.realpath(_version.HEADER),
                         os.path.realpath(header))
        self.assertEqual(mpilearn.__version__,
                         _version.version_in_header(header))
        self.assertRegex(mpilearn.__version__, r"^\d+\.\d+\.\d+")
        with open(header) as f:
            self.assertIn('"%s"' % mpilearn.__version__, f.read())

    def test_the_built_file_comes_first(self):
        generated = os.path.join(TMP, "version.py")
        with open(generated, "w") as f:
            f.write(_version.generated_file_text("7.8.9"))
        with mock.patch.object(_version, "GENERATED", generated):
            self.assertEqual(_version.find_version(), "7.8.9")
        missing = os.path.join(TMP, "no-such-file")
        with mock.patch.object(_version, "GENERATED", missing), \
                mock.patch.object(_version, "HEADER", missing):
            with self.assertRaisesRegex(ImportError,
                                        "pip install ./tools/python"):
                _version.find_version()


class FakeMasterTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.servers = []
        for name, version in (("newer", _other_minor(mpilearn.__version__)),
                              ("patch", _other_patch(mpilearn.__version__)),
                              ("old", None)):
            server, address = _start(version)
            cls.servers.append(server)
            setattr(cls, name, address)

    @classmethod
    def tearDownClass(cls):
        for server in cls.servers:
            server.stop(None)

    def test_another_major_minor_is_refused(self):
        theirs = _other_minor(mpilearn.__version__)
        with self.assertRaises(VersionMismatch) as caught:
            Client(self.newer, timeout=10)
        e = caught.exception
        self.assertIsInstance(e, MpiLearnError)
        self.assertEqual(e.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual((e.client_version, e.master_version),
                         (mpilearn.__version__, theirs))
        self.assertEqual(e.info["caller"], "bob")
        self.assertIn(
            "this mpilearn package is %s and the master at %s runs %s" %
            (mpilearn.__version__, self.newer, theirs), e.message)
        self.assertIn("pip install ./tools/python from the master's checkout",
                      e.message)
        # check_version=False goes on, and check_version() says it again.
        with Client(self.newer, timeout=10, check_version=False) as client:
            self.assertEqual(client.server_info()["version"], theirs)
            self.assertEqual(len(client.queue()), 3)
            with self.assertRaises(VersionMismatch):
                client.check_version()

    def test_another_patch_is_accepted(self):
        with Client(self.patch, timeout=10) as client:
            info = client.server_info()
        self.assertEqual(info, {
            "version": _other_patch(mpilearn.__version__),
            "caller": "bob",
            "role": "owner"
        })

    def test_a_master_before_0_10_is_refused(self):
        with self.assertRaises(VersionMismatch) as caught:
            Client(self.old, timeout=10)
        e = caught.exception
        self.assertIsNone(e.master_version)
        self.assertIsNone(e.info)
        self.assertIn("the master at %s predates 0.10" % self.old, e.message)
        self.assertIn("pip install ./tools/python", e.message)
        with Client(self.old, timeout=10, check_version=False) as client:
            with self.assertRaises(MpiLearnError) as caught:
                client.server_info()
            self.assertEqual(caught.exception.code,
                             grpc.StatusCode.UNIMPLEMENTED)

    def test_queue_order_positions_then_unknown(self):
        with Client(self.patch, timeout=10) as client:
            queued = client.queue()
        self.assertEqual([job["job_id"] for job in queued],
                         ["job-000002", "job-000003", "job-000001"])

    def test_cli_version(self):
        rc, out, err = _cli("--master", self.patch, "version")
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(out.splitlines(), [
            "client  %s (mpilearn)" % mpilearn.__version__,
            "master  %s at %s" % (_other_patch(mpilearn.__version__),
                                  self.patch),
            "caller  bob (role owner)",
        ])
        # Another major.minor: the lines, then the error; exit 1.
        rc, out, err = _cli("--master", self.newer, "version")
        self.assertEqual(rc, 1, out + err)
        self.assertIn("master  %s at %s" %
                      (_other_minor(mpilearn.__version__), self.newer), out)
        self.assertIn("pip install ./tools/python", err)
        rc, out, err = _cli("--master", self.old, "version")
        self.assertEqual(rc, 1, out + err)
        self.assertEqual(out, "")
        self.assertIn("predates 0.10", err)

    def test_cli_queue(self):
        rc, out, err = _cli("--master", self.patch, "queue")
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(out.splitlines(), [
            "POS  JOB         OWNER  PRIORITY  STUDY  NAME          NOTE",
            "1    job-000002  bob    0         -      n-job-000002  "
            "owner bob holds 1 group",
            "2    job-000003  bob    5         -      n-job-000003",
            "-    job-000001  bob    0         -      n-job-000001",
        ])
        # Every command but `version` checks the version first.
        rc, out, err = _cli("--master", self.newer, "queue")
        self.assertEqual(rc, 1, out + err)
        self.assertTrue(re.search(r"runs \d+\.\d+\.1:", err), err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
