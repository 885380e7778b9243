#!/usr/bin/env bash
# `pip install ./tools/python` into a fresh virtual environment that sees
# Debian's Python packages (grpcio, protobuf), offline: the build generates
# the gRPC stubs and writes the version (from common/version.h), the
# environment gets an `mpilearn` command and `import mpilearn` works from any
# directory; both then talk to a real mpilearn-master (a job submitted,
# listed and queued; `mpilearn version` shows the master's release, which
# must be mpilearn.__version__ and the installed distribution's). Every
# process and file it makes is its own, under TEST_TMPDIR.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:?must run under bazel test}/mpilearn"
TMP="${TEST_TMPDIR:?}"

fail() { echo "FAIL: $*" >&2; exit 1; }

# A copy of what a checkout holds (the runfiles are read-only symlinks).
SRC="$TMP/src"
mkdir -p "$SRC/tools/python" "$SRC/proto" "$SRC/common"
cp -rL "$RUNFILES/tools/python/pyproject.toml" "$RUNFILES/tools/python/setup.py" \
  "$RUNFILES/tools/python/README.md" "$RUNFILES/tools/python/mpilearn" "$SRC/tools/python/"
rm -rf "$SRC/tools/python/mpilearn/_gen"
cp -L "$RUNFILES/proto/mpilearn.proto" "$RUNFILES/proto/study.proto" "$SRC/proto/"
cp -L "$RUNFILES/common/version.h" "$SRC/common/"

/usr/bin/python3 -m venv --system-site-packages "$TMP/env" || fail "python3 -m venv"
PIP_LOG="$TMP/pip.log"
"$TMP/env/bin/pip" install --no-build-isolation --no-index "$SRC/tools/python" \
  >"$PIP_LOG" 2>&1 || { cat "$PIP_LOG" >&2; fail "pip install ./tools/python"; }
echo "ok: pip install"

[ -x "$TMP/env/bin/mpilearn" ] || fail "no mpilearn command in the environment"
"$TMP/env/bin/mpilearn" --help | grep -q -- "--master" || fail "mpilearn --help"
# Imported from the environment, with the stubs the build generated.
where=$(cd / && "$TMP/env/bin/python" -c \
  'import mpilearn, mpilearn._stubs as s; print(mpilearn.__file__); print(s._ROOT)')
grep -q "^$TMP/env/lib/" <<<"$where" || fail "mpilearn imported from elsewhere: $where"
grep -q "/mpilearn/_gen$" <<<"$where" || fail "stubs not from the build: $where"
# The version the build wrote into the package (no common/version.h beside
# an installed package), the same as the distribution's metadata.
versions=$(cd / && "$TMP/env/bin/python" -c '
import importlib.metadata, os, mpilearn, mpilearn._version as v
print(mpilearn.__version__, importlib.metadata.version("mpilearn"),
      os.path.isfile(v.GENERATED), os.path.isfile(v.HEADER))')
read -r VERSION DIST_VERSION GENERATED HEADER_BESIDE <<<"$versions"
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\. ]] || fail "mpilearn.__version__ is '$VERSION'"
[ "$DIST_VERSION" = "$VERSION" ] || \
  fail "the distribution is $DIST_VERSION, mpilearn.__version__ $VERSION"
[ "$GENERATED" = True ] && [ "$HEADER_BESIDE" = False ] || \
  fail "the version should come from the built package's _gen/version.py: $versions"
echo "ok: mpilearn command and import from the environment (version $VERSION)"

# Against a real master.
STATE="$TMP/master"
mkdir -p "$STATE"
"$RUNFILES/server/mpilearn-master" --listen 127.0.0.1:0 --port_file "$STATE/port" \
  --metrics_listen 127.0.0.1:0 --metrics_port_file "$STATE/metrics_port" \
  --state_dir "$STATE" 2>"$STATE/master.log" &
MASTER=$!
trap 'kill -TERM "$MASTER" 2>/dev/null; wait "$MASTER" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  [ -s "$STATE/port" ] && break
  sleep 0.1
done
[ -s "$STATE/port" ] || { cat "$STATE/master.log" >&2; fail "master did not start"; }
ADDR="127.0.0.1:$(cat "$STATE/port")"
job=$(cd / && "$TMP/env/bin/python" -c '
import sys
from mpilearn import Client
client = Client(sys.argv[1], timeout=10)
job = client.submit(sys.argv[2])
print(job, client.status(job)["state"])' "$ADDR" "$RUNFILES/docs/examples/fashion_mnist.json")
grep -q "^job-[0-9]* JOB_STATE_QUEUED$" <<<"$job" || fail "submit through the client: $job"
listed=$("$TMP/env/bin/mpilearn" --master "$ADDR" jobs)
grep -q "${job%% *}" <<<"$listed" || fail "mpilearn jobs does not list ${job%% *}: $listed"
queued=$("$TMP/env/bin/mpilearn" --master "$ADDR" queue)
grep -Eq "^1 +${job%% *} " <<<"$queued" || fail "mpilearn queue does not put ${job%% *} first: $queued"
echo "ok: the installed client submitted ${job%% *}, listed and queued it"

# The master's release, as the installed command reports it, is the
# package's.
shown=$(cd / && "$TMP/env/bin/mpilearn" --master "$ADDR" version) || \
  fail "mpilearn version exited $?: $shown"
MASTER_VERSION=$(sed -nE 's/^master +([^ ]+) at .*/\1/p' <<<"$shown")
[ -n "$MASTER_VERSION" ] || fail "mpilearn version shows no master version: $shown"
[ "$MASTER_VERSION" = "$VERSION" ] || \
  fail "the master runs $MASTER_VERSION, the installed mpilearn.__version__ is $VERSION"
grep -Eq "^client +$VERSION \(mpilearn\)$" <<<"$shown" || \
  fail "mpilearn version does not show the client's $VERSION: $shown"
echo "ok: mpilearn.__version__ $VERSION is the master's"
