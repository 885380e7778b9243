"""A blocking client of mpilearn-master's Master (jobs) and Studies (MPI Opt)
services.

Every call takes and returns plain Python values: specs as dicts (or a JSON
or YAML file's path), results as the dicts google.protobuf.json_format's
MessageToDict writes with the proto field names (job_id, epochs_done),
enums by name ("JOB_STATE_RUNNING"), every non-optional field present (zero
values included), proto3 `optional` fields only when set (a trial's
"value"), 64-bit integers as strings (the protobuf JSON mapping), and a
trial's parameter values as google.protobuf.Value holds them: every number
a float (batch_size 64.0, model.hidden [256.0, 128.0]).

Every failure, the master's or the transport's, raises MpiLearnError with
the gRPC code, the master's message, and the machine-readable reason the
master attaches (proto ErrorReason, by name). A spec that cannot be read or
does not match the message raises MpiLearnError with INVALID_ARGUMENT
before anything is sent.

Versions: a Client asks the master its release when it is made
(GetServerInfo) and raises VersionMismatch, an MpiLearnError, when the
master's major.minor is not this package's (mpilearn.__version__, the
release of the checkout it was built from) or the master predates 0.10;
Client(..., check_version=False) skips that call.

A master with TLS and tokens (docs/security.md): pass tls_ca (the CA's PEM
file; tls_cert and tls_key too for mutual TLS) and token (default: the
MPILEARN_TOKEN environment variable); the token rides on every call as
"authorization: Bearer TOKEN".

Threading: a Client holds one gRPC channel; its methods may be called from
several threads at once (gRPC channels are thread-safe). A generator from
watch_job / watch_study belongs to the thread iterating it.
"""

import json
import os
import time

import grpc
from google.protobuf import json_format

from mpilearn import _version
from mpilearn._stubs import mpilearn_pb2
from mpilearn._stubs import mpilearn_pb2_grpc
from mpilearn._stubs import study_pb2
from mpilearn._stubs import study_pb2_grpc

# The trailing metadata key gRPC carries a status's error_details in; the
# master puts a serialized v1::ErrorInfo there (common/grpc_status.h).
_ERROR_DETAILS_KEY = "grpc-status-details-bin"

JOB_ENDED_STATES = frozenset(
    ["JOB_STATE_COMPLETED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"])
STUDY_ENDED_STATES = frozenset(
    ["STUDY_STATE_COMPLETED", "STUDY_STATE_CANCELLED"])
TRIAL_ENDED_STATES = frozenset([
    "TRIAL_STATE_COMPLETED", "TRIAL_STATE_PRUNED", "TRIAL_STATE_FAILED",
    "TRIAL_STATE_CANCELLED"
])


class MpiLearnError(Exception):
    """A refused or failed call.

    Attributes:
      code: the grpc.StatusCode (INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE,
        UNIMPLEMENTED for a master without the service, ...).
      message: the master's message (or gRPC's, for transport failures),
        for people.
      reason: the master's ErrorReason by name ("ERROR_REASON_JOB_UNKNOWN"),
        for programs to branch on; None when the error carried none (errors
        made by the gRPC library itself, or local spec errors).
      method: the RPC that failed ("GetJobStatus"), or None.
    """

    def __init__(self, code, message, reason=None, method=None):
        self.code = code
        self.message = message
        self.reason = reason
        self.method = method
        super().__init__(str(self))

    @property
    def code_name(self):
        """The code as a string: "NOT_FOUND"."""
        return self.code.name if isinstance(self.code, grpc.StatusCode) \
            else str(self.code)

    def __str__(self):
        where = "%s: " % self.method if self.method else ""
        return "%s%s: %s" % (where, self.code_name, self.message)

    @classmethod
    def from_rpc_error(cls, error, method=None, target=None):
        """Converts a grpc.RpcError raised by a stub call."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        message = error.details() if hasattr(error, "details") else str(error)
        reason = None
        trailing = error.trailing_metadata() if hasattr(
            error, "trailing_metadata") else None
        for key, value in trailing or ():
            if key == _ERROR_DETAILS_KEY and isinstance(value, bytes):
                try:
                    info = mpilearn_pb2.ErrorInfo.FromString(value)
                    reason = mpilearn_pb2.ErrorReason.Name(info.reason)
                except Exception:  # pylint: disable=broad-except
                    reason = None  # Not ours (e.g. a google.rpc.Status).
        if code == grpc.StatusCode.UNAVAILABLE and target and reason is None:
            message = "cannot reach mpilearn-master at %s: %s" % (target,
                                                                 message)
        return cls(code, message or "", reason=reason, method=method)


class VersionMismatch(MpiLearnError):
    """The master is of another release than this package (a different
    major.minor), or predates 0.10 (it has no GetServerInfo). Its code is
    FAILED_PRECONDITION; the message names both releases and what to do.

    Attributes:
      client_version: this package's release (mpilearn.__version__).
      master_version: the master's, or None when it predates 0.10.
      info: the master's ServerInfo as a dict (version, caller, role), or
        None when it predates 0.10.
    """

    def __init__(self, target, client_version, info):
        self.client_version = client_version
        self.info = info
        self.master_version = info["version"] if info else None
        if info is None:
            master = ("the master at %s predates 0.10 (it does not answer "
                      "GetServerInfo)" % target)
        else:
            master = "the master at %s runs %s" % (target,
                                                   info["version"] or "?")
        super().__init__(
            grpc.StatusCode.FAILED_PRECONDITION,
            "this mpilearn package is %s and %s: install the client of the "
            "master's release (pip install ./tools/python from the master's "
            "checkout), or run a master of this release; "
            "Client(check_version=False) skips this check" %
            (client_version, master),
            method="GetServerInfo")


def _invalid(message):
    return MpiLearnError(grpc.StatusCode.INVALID_ARGUMENT, message,
                         reason="ERROR_REASON_INVALID_REQUEST")


def load_document(spec):
    """A spec as a dict: a dict (returned as is), or a JSON / YAML file path.

    Files ending in .yaml or .yml are read as YAML (python3-yaml's
    safe_load), anything else as JSON.
    """
    if isinstance(spec, dict):
        return spec
    if not isinstance(spec, (str, bytes, os.PathLike)):
        raise _invalid("a spec must be a dict or a file path, got %s" %
                       type(spec).__name__)
    path = os.fspath(spec)
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise _invalid("cannot read spec '%s': %s" % (path, e)) from None
    if str(path).lower().endswith((".yaml", ".yml")):
        import yaml  # pylint: disable=import-outside-toplevel
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise _invalid("spec '%s' is not valid YAML: %s" % (path, e)) \
                from None
    else:
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise _invalid("spec '%s' is not valid JSON: %s" % (path, e)) \
                from None
    if not isinstance(doc, dict):
        raise _invalid("spec '%s' must hold an object (a mapping), got %s" %
                       (path, type(doc).__name__))
    return doc


def _parse(doc, message, what):
    if isinstance(doc, type(message)):
        return doc
    try:
        return json_format.ParseDict(doc, message)
    except json_format.ParseError as e:
        raise _invalid("%s: %s" % (what, e)) from None


def to_dict(message):
    """A message as plain Python values (see the module comment)."""
    return json_format.MessageToDict(message,
                                     preserving_proto_field_name=True,
                                     including_default_value_fields=True)


def _trial_state(state):
    """TrialState from "PRUNED", "TRIAL_STATE_PRUNED" or the enum number."""
    if isinstance(state, int):
        return state
    name = str(state).upper()
    if not name.startswith("TRIAL_STATE_"):
        name = "TRIAL_STATE_" + name
    try:
        return study_pb2.TrialState.Value(name)
    except ValueError:
        raise _invalid("unknown trial state '%s'" % state) from None


class _BearerToken(grpc.UnaryUnaryClientInterceptor,
                   grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor,
                   grpc.StreamStreamClientInterceptor):
    """Adds "authorization: Bearer TOKEN" to every call's metadata.

    (gRPC's call credentials would only be sent over TLS; the master also
    checks tokens on plaintext loopback and Unix-socket ports.)
    """

    def __init__(self, token):
        self._entry = ("authorization", "Bearer " + token)

    def _details(self, details):
        metadata = list(details.metadata or []) + [self._entry]
        return details._replace(metadata=metadata) if hasattr(
            details, "_replace") else _CallDetails(details, metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class _CallDetails(grpc.ClientCallDetails):
    """A ClientCallDetails with other metadata."""

    def __init__(self, details, metadata):
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


def _read_file(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise MpiLearnError(grpc.StatusCode.INVALID_ARGUMENT,
                            "%s: cannot read '%s': %s" %
                            (what, path, e.strerror)) from None


def open_channel(target, tls_ca=None, tls_cert=None, tls_key=None,
                 token=None):
    """A channel to `target`: TLS when tls_ca is given (not for a unix:
    target, which the master serves in plaintext), the bearer token on
    every call when one is given (None: $MPILEARN_TOKEN, if set)."""
    if bool(tls_cert) != bool(tls_key):
        raise MpiLearnError(grpc.StatusCode.INVALID_ARGUMENT,
                            "mutual TLS needs both tls_cert and tls_key")
    if tls_cert and not tls_ca:
        raise MpiLearnError(grpc.StatusCode.INVALID_ARGUMENT,
                            "tls_cert and tls_key need tls_ca")
    if token is None:
        token = os.environ.get("MPILEARN_TOKEN", "")
    token = token.strip()
    if token and any(c <= " " or c > "~" for c in token):
        raise MpiLearnError(grpc.StatusCode.INVALID_ARGUMENT,
                            "the token has a space or a character outside "
                            "printable ASCII")
    if tls_ca and not target.startswith("unix:"):
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read_file(tls_ca, "tls_ca"),
            private_key=_read_file(tls_key, "tls_key") if tls_key else None,
            certificate_chain=(_read_file(tls_cert, "tls_cert")
                               if tls_cert else None))
        channel = grpc.secure_channel(target, credentials)
    else:
        channel = grpc.insecure_channel(target)
    if token:
        channel = grpc.intercept_channel(channel, _BearerToken(token))
    return channel


class Client:
    """Calls one mpilearn-master.

    Args:
      target: the master's host:port ("127.0.0.1:7070").
      timeout: seconds each unary call may take (a deadline, so a master
        that does not answer raises DEADLINE_EXCEEDED instead of hanging).
      channel: an existing grpc.Channel to use instead of opening one
        (tests); the client then does not close it.
      tls_ca: PEM file of the CA of the master's certificate: speak TLS.
      tls_cert, tls_key: PEM files of this client's certificate and key
        (mutual TLS).
      token: the bearer token; None takes $MPILEARN_TOKEN (if set), ""
        sends none.
      check_version: ask the master its release now (check_version()):
        VersionMismatch for another major.minor or a master before 0.10,
        and the master's error when it cannot answer (UNAVAILABLE,
        UNAUTHENTICATED). False: no call until the first method's.
    """

    def __init__(self, target, timeout=30.0, channel=None, tls_ca=None,
                 tls_cert=None, tls_key=None, token=None, check_version=True):
        self.target = target
        self.timeout = timeout
        self._own_channel = channel is None
        self._channel = channel or open_channel(
            target, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
            token=token)
        self._master = mpilearn_pb2_grpc.MasterStub(self._channel)
        self._studies = study_pb2_grpc.StudiesStub(self._channel)
        if check_version:
            try:
                self.check_version()
            except MpiLearnError:
                self.close()
                raise

    def close(self):
        if self._own_channel:
            self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *unused):
        self.close()

    def _call(self, stub, method, request):
        try:
            return getattr(stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise MpiLearnError.from_rpc_error(e, method, self.target) \
                from None

    # -- The master ----------------------------------------------------------

    def server_info(self):
        """The master's ServerInfo as a dict: "version" (its release,
        "0.10.0"), "caller" (the token's name; "" without tokens) and
        "role" ("admin", "owner", "worker" or "reader"). UNIMPLEMENTED from
        a master before 0.10."""
        return to_dict(
            self._call(self._master, "GetServerInfo",
                       mpilearn_pb2.GetServerInfoRequest()))

    def check_version(self):
        """The master's server_info() when its release has this package's
        major.minor; VersionMismatch otherwise (also for a master before
        0.10, which has no GetServerInfo)."""
        client_version = _version.find_version()
        try:
            info = self.server_info()
        except MpiLearnError as e:
            if e.code == grpc.StatusCode.UNIMPLEMENTED:
                raise VersionMismatch(self.target, client_version,
                                      None) from None
            raise
        if not _version.same_major_minor(client_version, info["version"]):
            raise VersionMismatch(self.target, client_version, info)
        return info

    # -- Jobs (the Master service) -----------------------------------------

    def submit(self, spec):
        """Queues a job; returns its id ("job-000001").

        spec: a JobSpec as a dict, or a JSON / YAML file holding one.
        """
        request = mpilearn_pb2.SubmitJobRequest(
            spec=_parse(load_document(spec), mpilearn_pb2.JobSpec(),
                        "job spec"))
        return self._call(self._master, "SubmitJob", request).job_id

    def status(self, job_id):
        """The job's JobStatus (history, groups, validations) as a dict."""
        return to_dict(
            self._call(self._master, "GetJobStatus",
                       mpilearn_pb2.GetJobStatusRequest(job_id=job_id)))

    def list_jobs(self, states=None, page_size=0):
        """Every job's JobStatus, without histories, as a list of dicts,
        following the master's pages.

        states: only jobs in these states (names such as
        "JOB_STATE_RUNNING" or "running"); None or empty: every job.
        page_size: jobs per ListJobs call (0: the master's default, 100).
        Jobs the master leaves out as too large to list (left_out) are
        missing; status(job_id) shows each.
        """
        return [to_dict(job) for page in self.list_job_pages(states, page_size)
                for job in page.jobs]

    def list_job_pages(self, states=None, page_size=0):
        """Yields each ListJobsResponse message of the listing in turn."""
        request = mpilearn_pb2.ListJobsRequest(page_size=page_size)
        for state in states or ():
            name = state.upper()
            if not name.startswith("JOB_STATE_"):
                name = "JOB_STATE_" + name
            try:
                request.states.append(mpilearn_pb2.JobState.Value(name))
            except ValueError:
                raise _invalid("unknown job state '%s'" % state) from None
        while True:
            response = self._call(self._master, "ListJobs", request)
            yield response
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    def queue(self):
        """The QUEUED jobs' JobStatus dicts in the order groups will take
        them ("queue_position" 1 first; a job without a position, from a
        master before 0.10, last); each says why a limit holds it back in
        "queue_note" (docs/scheduling.md)."""
        queued = self.list_jobs(states=["queued"])
        return sorted(queued, key=lambda job: job.get("queue_position") or
                      float("inf"))

    def cancel(self, job_id, reason=""):
        """Ends a QUEUED or RUNNING job as CANCELLED (its groups leave, its
        weights are checkpointed); returns its JobStatus dict. Needs the
        job's owner or an admin token; FAILED_PRECONDITION for a job that
        has ended."""
        return to_dict(
            self._call(self._master, "CancelJob",
                       mpilearn_pb2.CancelJobRequest(job_id=job_id,
                                                     reason=reason)))

    def delete(self, job_id):
        """Removes an ended job from the master and its state directory.
        Needs the job's owner or an admin token; FAILED_PRECONDITION for a job still QUEUED or
        RUNNING (cancel it first)."""
        self._call(self._master, "DeleteJob",
                   mpilearn_pb2.DeleteJobRequest(job_id=job_id))

    def watch_job(self, job_id, interval=2.0):
        """Yields the job's status when it changes (the first at once),
        polling every `interval` seconds, until it ended (COMPLETED, FAILED
        or CANCELLED: that status is the last one yielded)."""
        last = None
        while True:
            status = self.status(job_id)
            if status != last:
                yield status
                last = status
            if status.get("state") in JOB_ENDED_STATES:
                return
            time.sleep(interval)

    # -- Studies (MPI Opt) -------------------------------------------------

    def create_study(self, spec):
        """Creates and starts a study; returns its id.

        spec: a StudySpec as a dict, or a JSON / YAML file holding one
        (docs/examples/opt_fashion_mnist.yaml).
        """
        request = study_pb2.CreateStudyRequest(spec=_parse(
            load_document(spec), study_pb2.StudySpec(), "study spec"))
        return self._call(self._studies, "CreateStudy", request).study_id

    def get_study(self, study_id):
        """The study's StudyStatus (every trial) as a dict."""
        return to_dict(self.get_study_message(study_id))

    def get_study_message(self, study_id):
        """The study's StudyStatus as the protobuf message."""
        return self._call(self._studies, "GetStudy",
                          study_pb2.GetStudyRequest(study_id=study_id))

    def list_studies(self):
        """Every study's StudyStatus, without trials, as a list of dicts."""
        response = self._call(self._studies, "ListStudies",
                              study_pb2.ListStudiesRequest())
        return [to_dict(study) for study in response.studies]

    def watch_study(self, study_id):
        """Yields StudyEvent dicts: a KIND_SNAPSHOT per trial, then each
        change, until KIND_STUDY_ENDED (the last one yielded). Closing the
        generator early cancels the stream. No deadline: a study may run
        for hours."""
        call = self._studies.WatchStudy(
            study_pb2.WatchStudyRequest(study_id=study_id))
        try:
            for event in call:
                yield to_dict(event)
                if event.kind == study_pb2.StudyEvent.KIND_STUDY_ENDED:
                    return
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                return
            raise MpiLearnError.from_rpc_error(e, "WatchStudy",
                                               self.target) from None
        finally:
            call.cancel()

    def cancel_study(self, study_id, reason=""):
        """Stops the study (trials in flight CANCELLED); returns its
        StudyStatus dict."""
        return to_dict(
            self._call(
                self._studies, "CancelStudy",
                study_pb2.CancelStudyRequest(study_id=study_id,
                                             reason=reason)))

    def cancel_trial(self, study_id, trial, reason=""):
        """Stops one trial (its job too); returns the Trial dict."""
        return to_dict(
            self._call(
                self._studies, "CancelTrial",
                study_pb2.CancelTrialRequest(study_id=study_id,
                                             trial=_trial_number(trial),
                                             reason=reason)))

    def ask(self, study_id, params=None):
        """Starts a trial now and returns it (a Trial dict: "number",
        "job_id", "params", ...).

        params: values by path ({"optimizer.learning_rate": 0.01,
        "model.hidden": [256, 128]}), every parameter of the study; None or
        {} lets the study's sampler propose them.
        """
        request = _parse({"study_id": study_id, "params": params or {}},
                         study_pb2.AskTrialRequest(), "params")
        return to_dict(self._call(self._studies, "AskTrial", request))

    def tell(self, study_id, trial, state, value=None, message=""):
        """An external optimizer's verdict on a trial; returns the Trial
        dict.

        trial: the trial's number, or the dict ask() returned.
        state: "COMPLETED" (value required unless the trial has one),
          "PRUNED" or "FAILED" (also "TRIAL_STATE_..." or the enum number).
          A trial whose job still runs has it stopped.
        """
        request = study_pb2.TellTrialRequest(study_id=study_id,
                                             trial=_trial_number(trial),
                                             state=_trial_state(state),
                                             message=message)
        if value is not None:
            request.value = float(value)
        return to_dict(self._call(self._studies, "TellTrial", request))


def _trial_number(trial):
    if isinstance(trial, dict):
        return int(trial.get("number", 0))
    return int(trial)
