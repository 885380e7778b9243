#!/usr/bin/env bash
# Runs a Python test script with Debian's /usr/bin/python3 from the runfiles
# root, with tools/python (the mpilearn package and its stubs) on
# PYTHONPATH: run_python.sh SCRIPT [ARGS...].
set -euo pipefail
cd "${TEST_SRCDIR:?must run under bazel test}/mpilearn"
export PYTHONPATH="$PWD/tools/python${PYTHONPATH:+:$PYTHONPATH}"
export MPLBACKEND=Agg
# Matplotlib caches fonts here (HOME is not writable under bazel test).
export MPLCONFIGDIR="${TEST_TMPDIR:?}/matplotlib"
exec /usr/bin/python3 -B "$@"
