"""Runs the `mpilearn` command line (python3 -m mpilearn) of the package on
PYTHONPATH for the Python tests (tests/run_python.sh sets it)."""

import subprocess
import sys


def run_cli(*args):
    """Runs python3 -m mpilearn ARGS; returns (exit status, stdout, stderr)."""
    done = subprocess.run([sys.executable, "-B", "-m", "mpilearn"] +
                          list(args),
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          timeout=60,
                          check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()
