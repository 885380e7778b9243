#!/usr/bin/env bash
# Checked locking: compiles with clang-14 and -Wthread-safety (errors, via
# `--config=clang-tsa` in .bazelrc), so every ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED and ABSL_LOCKS_EXCLUDED in the code is
# checked. gcc ignores those annotations; this is the only build that
# enforces them. tools/test.sh runs it after the tests.
#
#   tools/check_thread_safety.sh                 # every target that can have a finding
#   tools/check_thread_safety.sh //server/...    # these patterns (//... = whole tree)
#
# Without patterns it compiles the rules whose sources hold a lock or a lock
# annotation, or include a header that does (see locking_targets below):
# the rest of the tree, LibTorch's heavy translation units among them, has
# nothing for the analysis to check. It only compiles (the
# compilation_outputs output group): the analysis is a compiler pass, so
# nothing is linked.
#
# Exits 0 when the compile succeeds with no thread-safety diagnostic, 1 when
# a thread-safety finding is reported (each is listed at the end), 2 when the
# compile fails for another reason. Other clang warnings are counted but do
# not fail the check.
#
# The clang build lives in its own Bazel output base (and so its own Bazel
# server), so it never evicts the gcc build's cache. TSA_OUTPUT_BASE
# overrides the output base; MPILEARN_DISK_CACHE names a Bazel disk cache
# to share (tools/test.sh sets it). The clang server exits by itself after
# five idle minutes. The config creates no convenience symlinks (bazel-bin,
# ...): they belong to the gcc build.
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

# Every top-level package directory: from another output base, a literal
# `//...` would make Bazel walk into the gcc build's bazel-* symlinks.
whole_tree() {
  [ ! -f BUILD ] || echo //:all
  find . -mindepth 2 -name BUILD -not -path './bazel-*' -not -path './.*' \
    | cut -d/ -f2 | sort -u | sed 's|.*|//&/...|'
}

# The label of a source file: its path under the nearest package above it.
file_label() {
  local dir
  dir=$(dirname "$1")
  while [ "$dir" != . ] && [ ! -f "$dir/BUILD" ]; do dir=$(dirname "$dir"); done
  echo "//${dir}:${1#"$dir"/}"
}

# What the analysis can say anything about: a finding needs a lock, an
# annotated member or an annotated function in view of the code that uses
# it. So the checked sources are the files that hold a lock or an
# annotation, and every file that includes, directly or through other
# headers of the tree, a header that does; a translation unit that sees
# neither has nothing to check. The targets are the rules that list them.
locking_sources() {
  git ls-files -z --cached --others --exclude-standard '*.h' '*.cc' | /usr/bin/python3 -c '
import re, sys
files = [f for f in sys.stdin.read().split("\0") if f]
text = {f: open(f, errors="replace").read() for f in files}
lock = re.compile(r"absl/synchronization/|absl::Mutex|ABSL_(PT_)?GUARDED_BY|"
                  r"ABSL_(EXCLUSIVE|SHARED)_LOCKS_REQUIRED|ABSL_LOCKS_EXCLUDED|"
                  r"ABSL_LOCK_RETURNED|ABSL_ACQUIRED_(BEFORE|AFTER)")
include = re.compile(r"^#include \"([^\"]+)\"", re.M)
includes = {f: set(include.findall(text[f])) for f in files}
seen = {f for f in files if lock.search(text[f])}
headers = {f for f in seen if f.endswith(".h")}
while True:
  more = {f for f in files if f.endswith(".h") and f not in headers and includes[f] & headers}
  if not more:
    break
  headers |= more
seen |= {f for f in files if includes[f] & headers}
print("\n".join(sorted(seen)))
'
}
locking_targets() {
  local labels
  labels=$(locking_sources | while IFS= read -r f; do file_label "$f"; done | tr '\n' ' ')
  bazel --output_base="${output_base}" --max_idle_secs=300 query --keep_going \
    "kind('cc_(library|binary|test)', rdeps($(whole_tree | tr '\n' '+' | sed 's/+$//'), set(${labels}), 1))" \
    2>/dev/null
}

targets=()
if [ $# -eq 0 ]; then
  while IFS= read -r t; do targets+=("$t"); done < <(locking_targets)
  [ ${#targets[@]} -gt 0 ] || { echo "check_thread_safety: no target holds a lock?" >&2; exit 2; }
  scope="${#targets[@]} targets whose sources hold or see a lock annotation"
else
  for pattern in "$@"; do
    if [ "$pattern" = //... ]; then
      while IFS= read -r t; do targets+=("$t"); done < <(whole_tree)
    else
      targets+=("$pattern")
    fi
  done
  scope="${targets[*]}"
fi

# The same persistent disk cache as tools/test.sh: a fresh clone on this
# machine reuses every compile whose inputs have not changed.
cache_flags=()
[ -z "${MPILEARN_DISK_CACHE:-}" ] || cache_flags=(--disk_cache="${MPILEARN_DISK_CACHE}")

log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "check_thread_safety: clang-14 compile of ${scope} (output base ${output_base})"
set +e
bazel --output_base="${output_base}" --max_idle_secs=300 \
  build --config=clang-tsa --keep_going --output_groups=compilation_outputs \
  "${cache_flags[@]}" -- "${targets[@]}" 2>&1 | tee "$log"
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
