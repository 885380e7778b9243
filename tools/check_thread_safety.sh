#!/usr/bin/env bash
# Checked locking: builds the whole tree with clang-14 and -Wthread-safety
# (errors, via `--config=clang-tsa` in .bazelrc), so every ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED and ABSL_LOCKS_EXCLUDED in the code is
# checked at compile time. gcc ignores those annotations; this is the only
# build that enforces them. tools/test.sh runs it after the tests.
#
#   tools/check_thread_safety.sh                 # the whole tree
#   tools/check_thread_safety.sh //server/...    # a subset
#
# Exits 0 when the build succeeds with no thread-safety diagnostic, 1 when a
# thread-safety finding is reported (each is listed at the end), 2 when the
# build fails for another reason. Other clang warnings are counted but do not
# fail the check.
#
# The clang build lives in its own Bazel output base (and so its own Bazel
# server), so it never evicts the gcc build's cache. By hand:
#
#   bazel --output_base=$HOME/.cache/bazel-clang-tsa-CHECKOUT \
#       build --config=clang-tsa //common/... //server/... ...
#
# TSA_OUTPUT_BASE overrides the output base. The clang server exits by
# itself after five idle minutes. The config creates no convenience symlinks
# (bazel-bin, ...): they belong to the gcc build.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v clang-14 >/dev/null || {
  echo "check_thread_safety: clang-14 not found (tools/install_deps.sh installs it)" >&2
  exit 2
}

# One output base per checkout (as Bazel's own default is per workspace),
# so two clones never share, and fight over, one clang build.
checkout_key=$(pwd -P | md5sum | cut -c1-12)
output_base=${TSA_OUTPUT_BASE:-${HOME}/.cache/bazel-clang-tsa-${checkout_key}}

# `//...` (or no pattern) means every top-level package directory: from
# another output base, a literal `//...` would make Bazel walk into the gcc
# build's bazel-* symlinks.
whole_tree() {
  [ ! -f BUILD ] || echo //:all
  find . -mindepth 2 -name BUILD -not -path './bazel-*' -not -path './.*' \
    | cut -d/ -f2 | sort -u | sed 's|.*|//&/...|'
}
targets=()
for pattern in "${@:-//...}"; do
  if [ "$pattern" = //... ]; then
    while IFS= read -r t; do targets+=("$t"); done < <(whole_tree)
  else
    targets+=("$pattern")
  fi
done

log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "check_thread_safety: clang-14 build of ${targets[*]} (output base ${output_base})"
set +e
bazel --output_base="${output_base}" --max_idle_secs=300 \
  build --config=clang-tsa --keep_going \
  -- "${targets[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e

# clang tags each diagnostic with its flag: [-Wthread-safety-analysis],
# [-Werror,-Wthread-safety-reference], ... Failed compiles are not cached,
# so a finding shows up again on every run until it is fixed.
findings=$(grep -E '^[^ ].*: (warning|error): .*\[(-Werror,)?-Wthread-safety' "$log" \
             | sort -u || true)
others=$(grep -E '^[^ ].*: warning: .*\[-W' "$log" | grep -v -- '-Wthread-safety' \
           | sort -u || true)

if [ -n "$others" ]; then
  echo "check_thread_safety: $(wc -l <<<"$others") other clang warning(s) (not fatal):"
  sed 's/^/  /' <<<"$others"
fi
if [ -n "$findings" ]; then
  echo "check_thread_safety: FAILED, $(wc -l <<<"$findings") thread-safety finding(s):"
  sed 's/^/  /' <<<"$findings"
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "check_thread_safety: FAILED, the clang build failed (exit $rc), see above"
  exit 2
fi
echo "check_thread_safety: OK, no thread-safety findings"
