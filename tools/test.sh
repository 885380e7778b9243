#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine (packages, Bazel build) and runs the
# whole test suite: the layout rules (tools/check_layout.sh), the unit tests
# beside the code and the integration tests in tests/ (real master on
# loopback, real mpirun groups). Then checks locking:
# tools/check_thread_safety.sh compiles every target that can have a
# finding with clang-14 and -Wthread-safety (in its own Bazel output base),
# and tools/fuzz.sh runs each libFuzzer target of tests/fuzz for a short
# while (clang-14, ASan, UBSan, its own output base too). The exit code is
# non-zero when any of them fails; the last line is always the test count.
#
#   tools/test.sh                 # everything
#   tools/test.sh //common/...    # a subset (any bazel target patterns)
#   MPILEARN_TSA=0 tools/test.sh  # skip the clang build (a quick local run)
#   MPILEARN_FUZZ=0 tools/test.sh # skip the fuzz run
#
# All three builds share one Bazel disk cache (MPILEARN_DISK_CACHE, default
# ~/.cache/mpilearn-bazel-disk), so a fresh clone on a machine that built
# the tree before recompiles only what changed. Test results are never taken
# from it: every test runs. Each phase prints its duration.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
phase() { echo "test.sh: $1 took $((SECONDS - phase_start)) s"; phase_start=$SECONDS; }
phase_start=$SECONDS

layout_rc=0
tools/check_layout.sh || layout_rc=$?

tools/install_deps.sh
phase "installing packages"

export MPILEARN_DISK_CACHE=${MPILEARN_DISK_CACHE:-${HOME}/.cache/mpilearn-bazel-disk}
mkdir -p "$MPILEARN_DISK_CACHE"

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(//...)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Two cores: integration tests start a master and mpirun groups of their own,
# so they run one at a time.
set +e
bazel test --local_test_jobs=1 --disk_cache="$MPILEARN_DISK_CACHE" \
  --nocache_test_results "${targets[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
phase "building and running the tests"

tsa_rc=0
if [ "${MPILEARN_TSA:-1}" != 0 ]; then
  tools/check_thread_safety.sh "$@" || tsa_rc=$?
  phase "the thread-safety check"
else
  echo "test.sh: thread-safety check skipped (MPILEARN_TSA=0)"
fi
fuzz_rc=0
if [ "${MPILEARN_FUZZ:-1}" != 0 ] && [ $# -eq 0 ]; then
  tools/fuzz.sh --seconds "${MPILEARN_FUZZ_SECONDS:-15}" || fuzz_rc=$?
  phase "the fuzz run"
else
  echo "test.sh: fuzz run skipped (MPILEARN_FUZZ=0 or a subset of targets)"
fi
[ "$rc" -ne 0 ] || rc=$layout_rc
[ "$rc" -ne 0 ] || rc=$tsa_rc
[ "$rc" -ne 0 ] || rc=$fuzz_rc

# One plain closing line, counted per test target.
passed=$(grep -cE '^//.* PASSED in' "$log" || true)
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)' "$log" || true)
echo "test.sh: everything took $((SECONDS - start)) s"
echo "tests: ${passed} passed, ${failed} failed"
exit "$rc"
