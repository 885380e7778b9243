#!/usr/bin/env bash
# Fuzzing: builds the libFuzzer targets of tests/fuzz with clang-14, ASan
# and UBSan (--config=fuzz in .bazelrc, in its own Bazel output base so the
# gcc build's cache is untouched) and runs each for a bounded time from its
# seeds (the target's own, written by its replay binary). Any crash,
# sanitizer report, leak, timeout (-timeout, seconds per input) or memory
# over -rss_limit_mb fails the run; libFuzzer leaves the input that did it
# in the work directory (crash-*, leak-*, timeout-*, oom-*).
#
#   tools/fuzz.sh                                 # every target, 20 s each
#   tools/fuzz.sh --seconds 600 job_spec_fuzz     # a long run of one target
#   tools/fuzz.sh --runs 1000000 --keep DIR ...   # a fixed number of inputs,
#                                                 # corpora kept in DIR
#
# Prints one line per target with the inputs run and their rate, and
# "fuzz: N inputs in total" last. tools/test.sh runs the short form.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=20
runs=-1
keep=""
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift ;;
    --runs) runs=$2; seconds=0; shift ;;
    --keep) keep=$2; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz: unknown flag '$1' (see --help)" >&2; exit 2 ;;
    *) targets+=("$1") ;;
  esac
  shift
done
[ ${#targets[@]} -gt 0 ] || targets=(job_spec_fuzz tensor_wire_fuzz checkpoint_fuzz master_core_fuzz slice_join_fuzz)

command -v clang-14 >/dev/null || {
  echo "fuzz: clang-14 not found (tools/install_deps.sh installs it)" >&2
  exit 2
}

checkout_key=$(pwd -P | md5sum | cut -c1-12)
output_base=${FUZZ_OUTPUT_BASE:-${HOME}/.cache/bazel-clang-fuzz-${checkout_key}}
bazel_fuzz() { bazel --output_base="${output_base}" --max_idle_secs=300 "$@"; }

labels=()
for t in "${targets[@]}"; do labels+=("//tests/fuzz:$t" "//tests/fuzz:${t}_test"); done
echo "fuzz: clang-14 build of ${targets[*]} (output base ${output_base})"
cache_flags=()
[ -z "${MPILEARN_DISK_CACHE:-}" ] || cache_flags=(--disk_cache="${MPILEARN_DISK_CACHE}")
bazel_fuzz build --config=fuzz "${cache_flags[@]}" -- "${labels[@]}"
bin=$(bazel_fuzz info --config=fuzz bazel-bin 2>/dev/null)

work=${keep:-$(mktemp -d)}
mkdir -p "$work"
[ -n "$keep" ] || trap 'rm -rf "$work"' EXIT

total=0
status=0
for t in "${targets[@]}"; do
  corpus="$work/corpus-$t"
  mkdir -p "$corpus"
  "$bin/tests/fuzz/${t}_test" --write_seeds "$corpus" >/dev/null
  log="$work/$t.log"
  limits=(-rss_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=1)
  if [ "$runs" -ge 0 ]; then limits+=(-runs="$runs"); else limits+=(-max_total_time="$seconds"); fi
  set +e
  (cd "$work" && ASAN_OPTIONS=detect_leaks=1 "$bin/tests/fuzz/$t" "${limits[@]}" "$corpus") \
    >"$log" 2>&1
  rc=$?
  set -e
  n=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -1)
  rate=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+).*/\1/p' "$log" | tail -1)
  total=$((total + ${n:-0}))
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $t FAILED (exit $rc) after ${n:-?} inputs; the end of its log ($log):"
    tail -40 "$log" | sed 's/^/  /'
    ls "$work" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | sed 's/^/  input: /' || true
    status=1
    [ -n "$keep" ] || trap - EXIT  # keep the inputs for a rerun
  else
    echo "fuzz: $t ok, ${n:-?} inputs (${rate:-?}/s), corpus $(ls "$corpus" | wc -l) files"
  fi
done
echo "fuzz: ${total} inputs in total"
exit "$status"
