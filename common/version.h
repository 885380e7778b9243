// MPI Learn's release: what the master reports (GetServerInfo,
// mpilearn_build_info) and what its clients are built as. Clients and a
// master of another major.minor refuse each other (docs/protocol.md,
// "Versions"); the Python package (tools/python/setup.py) reads its version
// from this line, so bump it here only.
#ifndef MPILEARN_COMMON_VERSION_H_
#define MPILEARN_COMMON_VERSION_H_

namespace mpilearn {

inline constexpr char kMpiLearnVersion[] = "0.10.0";

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_VERSION_H_
