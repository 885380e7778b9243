"""Builds the mpilearn package with its gRPC stubs (pyproject.toml has the
metadata). The stubs are generated at build time from the checkout's
proto/mpilearn.proto and proto/study.proto, as tools/python/gen_stubs.sh
does, into mpilearn/_gen/proto/ of the built package, where
mpilearn/_stubs.py finds them. Needs protoc and grpc_python_plugin
(Debian's protobuf-compiler and protobuf-compiler-grpc); the error says so.
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the checkout
PROTOS = ("proto/mpilearn.proto", "proto/study.proto")


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


setup(cmdclass={"build_py": BuildWithStubs})
