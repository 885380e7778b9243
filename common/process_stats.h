// Figures about this process: CPU time and resident memory. The one place
// they are read from the kernel, for the worker's telemetry and the master's
// process metrics alike.
//
//   const double cpu = ProcessCpuSeconds();
//   const double rss = ProcessResidentBytes();
//
// Both are cheap (one system call, one small /proc read) and safe to call
// from any thread; a figure the kernel does not give is 0.
#ifndef MPILEARN_COMMON_PROCESS_STATS_H_
#define MPILEARN_COMMON_PROCESS_STATS_H_

namespace mpilearn {

// CPU time this process has used since it started (user + system, all
// threads), in seconds; 0 if unknown.
double ProcessCpuSeconds();

// This process's resident memory now, in bytes; 0 if unknown.
double ProcessResidentBytes();

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_PROCESS_STATS_H_
