"""Command line: studies on a master, their progress, and their plots;
jobs listed, queued, cancelled and deleted; the master's version.

    python3 -m mpilearn --master 127.0.0.1:7070 status [STUDY_ID] [--json]
    python3 -m mpilearn --master 127.0.0.1:7070 watch STUDY_ID
    python3 -m mpilearn --master 127.0.0.1:7070 plots STUDY_ID --out DIR
    python3 -m mpilearn --master 127.0.0.1:7070 jobs [--state S[,S]] [--json]
    python3 -m mpilearn --master 127.0.0.1:7070 queue [--json]
    python3 -m mpilearn --master 127.0.0.1:7070 cancel JOB_ID [--reason TEXT]
    python3 -m mpilearn --master 127.0.0.1:7070 delete JOB_ID
    python3 -m mpilearn --master 127.0.0.1:7070 version

`list` is another name for `jobs`. The address may also come from
$MPILEARN_MASTER (as for mpilearnctl). Every command but `version` first
checks that the master's release has this package's major.minor.
Exit status: 0 done, 1 the master refused, could not be reached or is of
another release, 2 usage.
"""

import argparse
import json
import os
import sys

from mpilearn import _version
from mpilearn.client import Client
from mpilearn.client import MpiLearnError
from mpilearn.client import TRIAL_ENDED_STATES
from mpilearn.client import VersionMismatch


def _short(state):
    """"TRIAL_STATE_PRUNED" -> "PRUNED"."""
    for prefix in ("TRIAL_STATE_", "STUDY_STATE_", "JOB_STATE_", "KIND_"):
        if state.startswith(prefix):
            return state[len(prefix):]
    return state


def _fmt_value(value):
    return "-" if value is None else "%.4f" % value


def _plain(value):
    """Integral floats as ints (google.protobuf.Value holds every number as
    a double: batch_size 64.0, model.hidden [256.0, 128.0])."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _fmt_param(value):
    value = _plain(value)
    if isinstance(value, float):
        return "%.4g" % value
    return json.dumps(value, separators=(",", ":"))


def _table(rows):
    """Left-aligned columns, two blanks apart, no trailing blanks."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [str(c).ljust(w) for c, w in zip(r, widths)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _print_study(status):
    spec = status.get("spec", {})
    objective = spec.get("objective", {})
    trials = status.get("trials", [])
    counts = {}
    for t in trials:
        counts[_short(t.get("state", ""))] = counts.get(
            _short(t.get("state", "")), 0) + 1
    summary = [
        ("study", status.get("study_id", "")),
        ("name", spec.get("name", "")),
        ("state", _short(status.get("state", ""))),
        ("sampler", spec.get("sampler", "")),
        ("objective", "%s (%s)" % (objective.get("metric", ""),
                                   objective.get("direction", ""))),
        ("trials", "%d of %s: %s" % (len(trials), spec.get("trials", "?"),
                                     ", ".join("%d %s" % (n, s.lower())
                                               for s, n in sorted(
                                                   counts.items())) or
                                     "none yet")),
        ("best", "trial %d, %s" % (status["best_trial"], _fmt_value(
            status.get("best_value"))) if "best_trial" in status else "-"),
        ("epochs", str(status.get("epochs_trained", 0))),
    ]
    if status.get("message"):
        summary.append(("message", status["message"]))
    print(_table(summary))
    if not trials:
        return
    paths = [p.get("path", "") for p in spec.get("parameters", [])]
    rows = [["TRIAL", "STATE", "VALUE", "EPOCHS", "JOB"] + paths]
    for t in trials:
        rows.append([
            t.get("number", 0),
            _short(t.get("state", "")),
            _fmt_value(t.get("value")),
            t.get("epochs_done", 0),
            t.get("job_id", "") or "-",
        ] + [_fmt_param(t.get("params", {}).get(p)) for p in paths])
    print()
    print(_table(rows))


def _print_studies(studies):
    if not studies:
        print("no studies on the master")
        return
    rows = [["STUDY", "NAME", "STATE", "RUNNING", "BEST", "EPOCHS"]]
    for s in studies:
        rows.append([
            s.get("study_id", ""),
            s.get("spec", {}).get("name", "") or "-",
            _short(s.get("state", "")),
            s.get("trials_running", 0),
            _fmt_value(s.get("best_value")),
            s.get("epochs_trained", 0),
        ])
    print(_table(rows))


def _or_none(text):
    return text if text else "-"


def _print_queue(queued, target):
    """The queue table (mpilearnctl queue's columns): POS JOB OWNER
    PRIORITY STUDY NAME, and NOTE when a limit holds a job back."""
    if not queued:
        print("no queued jobs on the master at %s" % target)
        return
    notes = any(job.get("queue_note") for job in queued)
    rows = [["POS", "JOB", "OWNER", "PRIORITY", "STUDY", "NAME"] +
            (["NOTE"] if notes else [])]
    for job in queued:
        spec = job.get("spec", {})
        rows.append([
            _or_none(job.get("queue_position")),
            job.get("job_id", ""),
            _or_none(spec.get("owner")),
            spec.get("priority", 0),
            _or_none(spec.get("study")),
            _or_none(spec.get("name")),
        ] + ([job.get("queue_note", "")] if notes else []))
    print(_table(rows))


def _print_versions(client_version, info, target):
    """This package's release, the master's and who the token is."""
    print(_table([
        ["client", "%s (mpilearn)" % client_version],
        ["master", "%s at %s" % (_or_none(info.get("version")), target)],
        ["caller", "%s (role %s)" % (_or_none(info.get("caller")),
                                     _or_none(info.get("role")))],
    ]))


def _version_command(client):
    """`version`: the versions, then exit 1 when the master's major.minor
    is not this package's (or the master predates 0.10)."""
    try:
        info = client.check_version()
    except VersionMismatch as e:
        if e.info is not None:
            _print_versions(e.client_version, e.info, client.target)
        raise
    _print_versions(_version.find_version(), info, client.target)


def _event_line(event):
    kind = _short(event.get("kind", ""))
    if kind == "STUDY_ENDED":
        return "study ended: %s (best %s)" % (
            _short(event.get("study_state", "")),
            _fmt_value(event.get("best_value")))
    trial = event.get("trial", {})
    line = "trial %d %s %s" % (trial.get("number", 0), kind.lower(),
                               _short(trial.get("state", "")))
    if kind == "REPORTED" and trial.get("intermediate"):
        last = trial["intermediate"][-1]
        line += " epoch %d value %.4f" % (last.get("epoch", 0),
                                          last.get("value", 0.0))
    elif trial.get("state") in TRIAL_ENDED_STATES:
        line += " value %s" % _fmt_value(trial.get("value"))
        if trial.get("message"):
            line += " (%s)" % trial["message"]
    return line


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="mpilearn",
        description="MPI Opt studies, jobs and the queue on an "
        "mpilearn-master, and its version.")
    parser.add_argument("--master",
                        default=os.environ.get("MPILEARN_MASTER", ""),
                        help="host:port of mpilearn-master "
                        "(default $MPILEARN_MASTER)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds per call (default 30)")
    parser.add_argument("--tls_ca", default=None,
                        help="PEM file of the CA of the master's "
                        "certificate: speak TLS (docs/security.md)")
    parser.add_argument("--tls_cert", default=None,
                        help="mutual TLS: this client's PEM certificate")
    parser.add_argument("--tls_key", default=None,
                        help="mutual TLS: its PEM key")
    parser.add_argument("--token_file", default=None,
                        help="file holding the bearer token (default "
                        "$MPILEARN_TOKEN)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    status = commands.add_parser("status",
                                 help="every study, or one study's trials")
    status.add_argument("study_id", nargs="?")
    status.add_argument("--json", action="store_true",
                        help="print the StudyStatus as JSON")
    watch = commands.add_parser("watch",
                                help="print a study's events until it ends")
    watch.add_argument("study_id")
    plots = commands.add_parser("plots", help="write a study's PNG plots")
    plots.add_argument("study_id")
    plots.add_argument("--out", required=True, help="directory for the PNGs")
    jobs = commands.add_parser("jobs", aliases=["list"],
                               help="every job: id, state, name, owner "
                               "(tab-separated)")
    jobs.add_argument("--state", default="",
                      help="only jobs in these states (comma-separated: "
                      "queued, running, completed, failed, cancelled)")
    jobs.add_argument("--json", action="store_true",
                      help="print the JobStatus list as JSON")
    cancel = commands.add_parser("cancel",
                                 help="end a queued or running job")
    cancel.add_argument("job_id")
    cancel.add_argument("--reason", default="",
                        help="why, kept in the job's message")
    delete = commands.add_parser("delete",
                                 help="remove an ended job from the master")
    delete.add_argument("job_id")
    queue = commands.add_parser(
        "queue", help="the queued jobs in the order groups will take them")
    queue.add_argument("--json", action="store_true",
                       help="print the queued jobs' JobStatus as JSON")
    commands.add_parser(
        "version",
        help="this package's release, the master's and who the token is; "
        "exit 1 when they differ in major.minor")
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_usage(sys.stderr)
        print("error: missing command (status, watch, plots, jobs, queue, "
              "cancel, delete or version)",
              file=sys.stderr)
        return 2
    if not args.master:
        print("error: no master address: pass --master HOST:PORT or set "
              "$MPILEARN_MASTER", file=sys.stderr)
        return 2

    token = None  # $MPILEARN_TOKEN
    if args.token_file:
        try:
            with open(args.token_file) as f:
                token = f.read().strip()
        except OSError as e:
            print("error: --token_file: cannot read '%s': %s" %
                  (args.token_file, e.strerror), file=sys.stderr)
            return 2
    try:
        with Client(args.master, timeout=args.timeout, tls_ca=args.tls_ca,
                    tls_cert=args.tls_cert, tls_key=args.tls_key,
                    token=token,
                    check_version=args.command != "version") as client:
            if args.command == "version":
                _version_command(client)
            elif args.command == "status":
                if args.study_id:
                    study = client.get_study(args.study_id)
                    if args.json:
                        print(json.dumps(study, indent=2))
                    else:
                        _print_study(study)
                else:
                    studies = client.list_studies()
                    if args.json:
                        print(json.dumps({"studies": studies}, indent=2))
                    else:
                        _print_studies(studies)
            elif args.command in ("jobs", "list"):
                states = [s for s in args.state.split(",") if s.strip()]
                listed = client.list_jobs(states=[s.strip() for s in states])
                if args.json:
                    print(json.dumps({"jobs": listed}, indent=2))
                else:
                    for job in listed:
                        spec = job.get("spec", {})
                        print("%s\t%s\t%s\t%s" % (
                            job.get("job_id", ""),
                            _short(job.get("state", "")),
                            _or_none(spec.get("name")),
                            _or_none(spec.get("owner"))))
            elif args.command == "queue":
                queued = client.queue()
                if args.json:
                    print(json.dumps({"jobs": queued}, indent=2))
                else:
                    _print_queue(queued, client.target)
            elif args.command == "cancel":
                job = client.cancel(args.job_id, reason=args.reason)
                print("%s %s" % (job.get("job_id", ""),
                                 _short(job.get("state", ""))))
            elif args.command == "delete":
                client.delete(args.job_id)
                print("%s deleted" % args.job_id)
            elif args.command == "watch":
                for event in client.watch_study(args.study_id):
                    print(_event_line(event), flush=True)
            elif args.command == "plots":
                from mpilearn import plots as plots_module  # pylint: disable=import-outside-toplevel
                for path in plots_module.save_study_plots(
                        client.get_study_message(args.study_id), args.out):
                    print(path)
    except MpiLearnError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
