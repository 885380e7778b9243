// Figures about this process the worker reports as telemetry: CPU time and
// resident memory. The one place the worker reads them from the kernel.
//
//   const double cpu = ProcessCpuSeconds();
//   const double rss = ProcessResidentBytes();
//
// Both are cheap (one system call, one small /proc read) and safe to call
// from any thread; a figure the kernel does not give is 0.
#ifndef MPILEARN_WORKER_PROCESS_STATS_H_
#define MPILEARN_WORKER_PROCESS_STATS_H_

namespace mpilearn::worker {

// CPU time this process has used since it started (user + system, all
// threads), in seconds; 0 if unknown.
double ProcessCpuSeconds();

// This process's resident memory now, in bytes; 0 if unknown.
double ProcessResidentBytes();

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_PROCESS_STATS_H_
