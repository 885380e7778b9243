// The interface every fuzz target in this directory implements.
//
// A target is one source file that defines LLVMFuzzerTestOneInput (the
// libFuzzer entry point: it must not crash, leak, hang or trip a sanitizer
// on any input) and mpilearn::fuzz::Seeds (valid inputs, built with the
// project's own encoders, from which mutation starts). The same file links
// two ways (tests/fuzz/fuzz.bzl):
//   NAME_test  a gcc cc_test (replay_main.cc): the seeds, the files given
//              on the command line, and a fixed number of deterministic
//              mutations of them; part of `bazel test //...`.
//   NAME       a libFuzzer binary, built with clang-14 under --config=fuzz
//              (tools/fuzz.sh), which also sanitizes (ASan, UBSan).
//
// A target checks properties as well as survival (a decoded value that
// re-encodes to the same bytes, say); FUZZ_CHECK aborts with a message when
// one fails, which both drivers report as a crash.
#ifndef MPILEARN_TESTS_FUZZ_FUZZ_TARGET_H_
#define MPILEARN_TESTS_FUZZ_FUZZ_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace mpilearn::fuzz {

// Valid inputs for the target (a starting corpus). The replay test checks
// that each seed is accepted: that the target calls Accepted() for it.
std::vector<std::string> Seeds();

// Called by a target when an input passed every check and reached the
// property checks (a seed that does not is a broken seed, and would make
// the mutations test only the error paths).
inline long accepted_inputs = 0;
inline void Accepted() { ++accepted_inputs; }

// `body` after its length in 2 bytes, little-endian: how targets whose
// inputs are sequences of messages frame each (bodies under 64 KiB).
inline std::string LengthPrefixed(const std::string& body) {
  std::string framed;
  framed.push_back(static_cast<char>(body.size() & 0xff));
  framed.push_back(static_cast<char>((body.size() >> 8) & 0xff));
  return framed + body;
}

// Protobuf logs every string field with invalid UTF-8 it refuses; a fuzzer
// makes millions. Targets that parse protobuf call this on each input.
void QuietProtobufLogs();

}  // namespace mpilearn::fuzz

#define FUZZ_CHECK(condition, what)                                    \
  do {                                                                 \
    if (!(condition)) {                                                \
      std::fprintf(stderr, "%s:%d: property failed: %s (%s)\n",        \
                   __FILE__, __LINE__, #condition, what);              \
      std::abort();                                                    \
    }                                                                  \
  } while (false)

#endif  // MPILEARN_TESTS_FUZZ_FUZZ_TARGET_H_
