#!/usr/bin/env bash
# Runs kubernetes/check_manifests.py (Debian's python3 and python3-yaml)
# against the manifests and the real binaries' flags.
set -euo pipefail
R="${TEST_SRCDIR:?must run under bazel test}/mpilearn"
exec /usr/bin/python3 -B "$R/deploy/kubernetes/check_manifests.py" "$R/deploy/kubernetes" \
  "$R/server/mpilearn-master" "$R/worker/mpilearn-worker" "$R/tools/cli/mpilearnctl"
