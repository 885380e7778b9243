"""Python client of MPI Learn's master: jobs (the Master service) and MPI Opt
studies (the Studies service), plus PNG plots of a study.

    from mpilearn import Client
    client = Client("127.0.0.1:7070")
    job_id = client.submit("docs/examples/fashion_mnist.json")
    for status in client.watch_job(job_id):
        print(status["state"], status.get("epochs_done", 0))

Messages come back as plain Python values (dicts, lists, numbers, strings),
as google.protobuf.json_format.MessageToDict writes them: proto field names
(snake_case), enums by name, 64-bit integers as strings. See docs/opt.md and
tools/python/README.md.

mpilearn.__version__ is the release of the checkout the package was built
from (common/version.h); Client refuses a master of another major.minor
with VersionMismatch.
"""

from mpilearn import _version
from mpilearn.client import Client, MpiLearnError, VersionMismatch

__version__ = _version.find_version()

__all__ = ["Client", "MpiLearnError", "VersionMismatch", "__version__"]
