"""Builds the mpilearn package with its gRPC stubs and its version
(pyproject.toml has the rest of the metadata). The stubs are generated at
build time from the checkout's proto/mpilearn.proto and proto/study.proto,
as tools/python/gen_stubs.sh does, into mpilearn/_gen/proto/ of the built
package, where mpilearn/_stubs.py finds them. The version is the master's,
read from the checkout's common/version.h and written into the package as
mpilearn/_gen/version.py (mpilearn.__version__; mpilearn/_version.py).
Needs protoc and grpc_python_plugin (Debian's protobuf-compiler and
protobuf-compiler-grpc); the error says so.
"""

import importlib.util
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the checkout
PROTOS = ("proto/mpilearn.proto", "proto/study.proto")
VERSION_HEADER = "common/version.h"


def _version_module():
    """mpilearn/_version.py, loaded alone (the package itself imports grpc
    and its stubs, which are not built yet)."""
    spec = importlib.util.spec_from_file_location(
        "mpilearn_version", os.path.join(HERE, "mpilearn", "_version.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VERSIONS = _version_module()


def read_version():
    """The release in the checkout's common/version.h."""
    version = VERSIONS.version_in_header(os.path.join(ROOT, VERSION_HEADER))
    if version is None:
        raise SystemExit(
            f"mpilearn: no kMpiLearnVersion in {VERSION_HEADER} under {ROOT}: "
            "install from a checkout (pip install ./tools/python)")
    return version


class BuildWithStubs(build_py):
    """build_py, then protoc into <build>/mpilearn/_gen/proto."""

    def run(self):
        super().run()
        plugin = os.environ.get("GRPC_PYTHON_PLUGIN",
                                shutil.which("grpc_python_plugin") or
                                "/usr/bin/grpc_python_plugin")
        protoc = shutil.which("protoc")
        if protoc is None or not os.access(plugin, os.X_OK):
            raise SystemExit(
                "mpilearn: building the gRPC stubs needs protoc and "
                "grpc_python_plugin (apt install protobuf-compiler "
                "protobuf-compiler-grpc)")
        for proto in PROTOS:
            if not os.path.isfile(os.path.join(ROOT, proto)):
                raise SystemExit(
                    f"mpilearn: {proto} not found under {ROOT}: install "
                    "from a checkout (pip install ./tools/python)")
        out = os.path.join(os.path.abspath(self.build_lib), "mpilearn", "_gen")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(os.path.join(out, "proto"))
        subprocess.run(
            [protoc, "--proto_path=.", f"--python_out={out}",
             f"--grpc_python_out={out}",
             f"--plugin=protoc-gen-grpc_python={plugin}", *PROTOS],
            cwd=ROOT, check=True)
        with open(os.path.join(out, "proto", "__init__.py"), "w") as f:
            f.write("# Generated when the mpilearn package was built.\n")
        with open(os.path.join(out, "version.py"), "w") as f:
            f.write(VERSIONS.generated_file_text(read_version()))


setup(version=read_version(), cmdclass={"build_py": BuildWithStubs})
