"""Finds and imports the generated gRPC stubs (proto/*_pb2.py).

protoc writes them as the package `proto` (study_pb2 does `from proto import
mpilearn_pb2`), so the directory holding `proto/` goes first on sys.path.
Two layouts are searched, in order:

  mpilearn/_gen/proto/     a checkout after tools/python/gen_stubs.sh
  <tools/python>/proto/    Bazel runfiles (the //tools/python:stubs genrule)

The generated `proto/__init__.py` makes it a regular package, so a
namespace directory named `proto` elsewhere on sys.path cannot shadow it.
"""

import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_CANDIDATES = (
    os.path.join(_PACKAGE_DIR, "_gen"),
    os.path.dirname(_PACKAGE_DIR),
)


def _stub_root():
    for root in _CANDIDATES:
        if os.path.isfile(os.path.join(root, "proto", "study_pb2_grpc.py")):
            return root
    raise ImportError(
        "mpilearn: generated gRPC stubs not found (looked for proto/"
        "study_pb2_grpc.py under %s); run tools/python/gen_stubs.sh in the "
        "checkout, or use the Bazel target //tools/python:client"
        % " and ".join(_CANDIDATES))


_ROOT = _stub_root()
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

_loaded = sys.modules.get("proto")
if _loaded is not None and os.path.dirname(
        os.path.abspath(getattr(_loaded, "__file__", "") or "")) != os.path.join(
            _ROOT, "proto"):
    raise ImportError(
        "mpilearn: another module named 'proto' (%r) is already imported; "
        "the generated stubs under %s/proto need that name"
        % (getattr(_loaded, "__file__", _loaded), _ROOT))

from proto import mpilearn_pb2  # noqa: E402
from proto import mpilearn_pb2_grpc  # noqa: E402
from proto import study_pb2  # noqa: E402
from proto import study_pb2_grpc  # noqa: E402

__all__ = ["mpilearn_pb2", "mpilearn_pb2_grpc", "study_pb2", "study_pb2_grpc"]
