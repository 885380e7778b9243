"""fuzz_target: one fuzz target source, built two ways (fuzz_target.h)."""

def fuzz_target(name, srcs, deps = [], data = [], args = [], size = "small"):
    """NAME_lib (the target), NAME_test (gcc replay test), NAME (libFuzzer).

    NAME is tagged manual: only `--config=fuzz` (clang-14) can link it, so
    `bazel build //...` under gcc skips it; tools/fuzz.sh builds it.
    """
    native.cc_library(
        name = name + "_lib",
        testonly = True,
        srcs = srcs + ["quiet_logs.cc"],
        hdrs = ["fuzz_target.h"],
        deps = deps + [
            "//tools/bazel/third_party:glog",
            "//tools/bazel/third_party:protobuf",
        ],
        alwayslink = True,
    )
    native.cc_test(
        name = name + "_test",
        size = size,
        srcs = ["replay_main.cc"],
        args = args + ["$(locations %s)" % d for d in data],
        data = data,
        deps = [":" + name + "_lib"],
    )
    native.cc_binary(
        name = name,
        testonly = True,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        deps = [":" + name + "_lib"],
    )
