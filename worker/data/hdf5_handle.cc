#include "worker/data/hdf5_handle.h"

#include "hdf5/serial/hdf5.h"

namespace mpilearn::worker {

void SilenceHdf5Errors() {
  thread_local bool silenced = false;
  if (silenced) return;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  silenced = true;
}

}  // namespace mpilearn::worker
