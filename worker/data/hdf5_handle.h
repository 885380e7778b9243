// What the HDF5 reader and writer share over the HDF5 C API: an owned
// identifier (Hid) and the switch that turns HDF5's printing of its error
// stack into statuses the caller builds.
//
// Thread safety: a Hid is used by one thread at a time; SilenceHdf5Errors
// acts on the calling thread (HDF5's thread-safe build keeps the setting per
// thread), so every entry point that calls HDF5 calls it first.
#ifndef MPILEARN_WORKER_DATA_HDF5_HANDLE_H_
#define MPILEARN_WORKER_DATA_HDF5_HANDLE_H_

#include <utility>

#include "hdf5/serial/hdf5.h"

namespace mpilearn::worker {

// Owns one HDF5 identifier and closes it with the matching H5*close.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);

  Hid() = default;
  Hid(hid_t id, Closer close) : id_(id), close_(close) {}
  Hid(Hid&& other) noexcept
      : id_(std::exchange(other.id_, H5I_INVALID_HID)), close_(other.close_) {}
  Hid& operator=(Hid&& other) noexcept {
    if (this != &other) {
      Reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      close_ = other.close_;
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { Reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes the handle now (the destructor then does nothing).
  void Reset() { Close(); }
  // As Reset; false when closing fails (e.g. a written file's final flush).
  bool Close() {
    const bool ok = id_ < 0 || close_(id_) >= 0;
    id_ = H5I_INVALID_HID;
    return ok;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// Turns off HDF5's printing of its error stack to stderr for the calling
// thread: errors become statuses.
void SilenceHdf5Errors();

}  // namespace mpilearn::worker

#endif  // MPILEARN_WORKER_DATA_HDF5_HANDLE_H_
