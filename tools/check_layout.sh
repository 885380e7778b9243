#!/usr/bin/env bash
# The tree's standing layout rules, checked from git's file list (no build):
#   - no non-test source file over 800 lines;
#   - no folder with more than 30 non-test source files;
#   - docs/architecture.md at most 600 lines, and every file or folder it
#     names in backticks (a path with a '/') exists.
# A test source is a file whose name holds `_test` or `test_`, or one under
# tests/. tools/test.sh runs this first; exits 1 and lists what breaks a rule.
#
#   tools/check_layout.sh
set -euo pipefail
cd "$(dirname "$0")/.."

max_lines=800
max_files=30
max_map_lines=600
status=0

sources=$(git ls-files --cached --others --exclude-standard \
            '*.cc' '*.h' '*.cu' '*.py' '*.sh' '*.bzl' \
          | grep -vE '(^|/)tests/|_test|(^|/)test_' || true)

while IFS= read -r f; do
  [ -f "$f" ] || continue
  n=$(wc -l <"$f")
  if [ "$n" -gt "$max_lines" ]; then
    echo "check_layout: $f has $n lines (at most $max_lines): split it along a seam"
    status=1
  fi
done <<<"$sources"

while read -r n dir; do
  if [ "$n" -gt "$max_files" ]; then
    echo "check_layout: $dir/ holds $n non-test source files (at most $max_files): make a package by concern"
    status=1
  fi
done < <(grep -v '\.bzl$' <<<"$sources" | xargs -n1 dirname | sort | uniq -c)

map=docs/architecture.md
n=$(wc -l <"$map")
if [ "$n" -gt "$max_map_lines" ]; then
  echo "check_layout: $map has $n lines (at most $max_map_lines): move details into the topic docs"
  status=1
fi
# Paths in backticks: relative to the tree, with at least one '/', no spaces,
# no label syntax (//, :) and no placeholders.
while IFS= read -r p; do
  p=${p%/}
  case "$p" in
    *'*'*|*'<'*|*'{'*|*:*|//*|/*|-*) continue ;;
  esac
  [ -e "$p" ] || { echo "check_layout: $map names $p, which is not in the tree"; status=1; }
done < <(grep -oE '`[A-Za-z0-9_./-]+/[A-Za-z0-9_./-]*`' "$map" | tr -d '`' | sort -u)

[ "$status" -ne 0 ] || echo "check_layout: OK (files <= $max_lines lines, folders <= $max_files sources, $map $n lines, its paths exist)"
exit "$status"
