"""The mpilearn package's release, and the rule for the master's.

The release has one source, common/version.h (kMpiLearnVersion): setup.py
reads it when the package is built and writes it into the package as
mpilearn/_gen/version.py. Two layouts are searched, in order:

  mpilearn/_gen/version.py   an installed package (pip install ./tools/python)
  <root>/common/version.h    a checkout or Bazel runfiles, <root> being the
                             directory three levels above this file (the
                             package sits at <root>/tools/python/mpilearn)

A client and a master work together when their releases have the same
major.minor ("0.10.0" and "0.10.3"; not "0.10.0" and "0.9.1").
"""

import os
import re

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
GENERATED = os.path.join(_PACKAGE_DIR, "_gen", "version.py")
HEADER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(_PACKAGE_DIR))),
    "common", "version.h")

# The line of common/version.h, and the one setup.py writes.
_HEADER_LINE = re.compile(r'kMpiLearnVersion\[\]\s*=\s*"([^"]+)"')
_GENERATED_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)
_MAJOR_MINOR = re.compile(r"^(\d+)\.(\d+)(?:$|\.)")


def _search(path, pattern):
    """The version `pattern` finds in the file at `path`; None when the file
    is missing or holds no such line."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            found = pattern.search(f.read())
    except OSError:
        return None
    return found.group(1) if found else None


def version_in_header(path):
    """The release common/version.h at `path` declares, or None."""
    return _search(path, _HEADER_LINE)


def generated_file_text(version):
    """What setup.py writes as mpilearn/_gen/version.py."""
    return ("# Generated from common/version.h when the mpilearn package was "
            "built.\n__version__ = \"%s\"\n" % version)


def find_version():
    """The release of this copy of the package (see the module comment)."""
    version = _search(GENERATED, _GENERATED_LINE) or version_in_header(HEADER)
    if version is None:
        raise ImportError(
            "mpilearn: cannot tell this package's version: neither %s "
            "(written when the package is built) nor %s (a checkout) holds "
            "it; install the package with pip install ./tools/python from a "
            "checkout, or run it from one" % (GENERATED, HEADER))
    return version


def same_major_minor(client, master):
    """Whether a client of release `client` may work with a master of
    release `master`: both start "MAJOR.MINOR" with the same numbers. A
    version not of that form (None, "") matches nothing."""
    ours = _MAJOR_MINOR.match(client or "")
    theirs = _MAJOR_MINOR.match(master or "")
    return bool(ours and theirs) and (
        tuple(int(n) for n in ours.groups()) ==
        tuple(int(n) for n in theirs.groups()))
