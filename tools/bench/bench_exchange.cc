// bench_exchange: what one exchange with a real mpilearn-master costs,
// against a plain TCP round trip of the same bytes on loopback, in one run.
//
//   bazel run -c opt //tools:bench_exchange -- [--json] [--sizes_mb 1,10,40]
//       [--dtypes float32,bfloat16,float16] [--iterations 20]
//       [--optimizer sgd|adam] [--master_bin PATH] [--transport tcp|unix]
//
// Starts mpilearn-master (from the Bazel runfiles, or --master_bin) on a free
// loopback port with a temporary --state_dir, removed at the end. For each
// size S (MB = 1e6 bytes of fp32 values) it builds a tensor set shaped like a
// model's (four large weight matrices and five bias-sized vectors, nine
// tensors in all) and, for each wire dtype, submits a downpour job (one group
// of one rank, exchange.update_dtype and weights_dtype set to the dtype, the
// chosen optimizer with a learning rate of 1e-6 so the weights barely move),
// sends the initial weights, and then times, interleaved so that load from
// other processes falls on all three alike:
//
//   push_pull  one MasterClient::PushGradient: the gradient goes out (every
//              TensorInfo and reply_dtype set to the dtype), the master
//              applies it with the job's optimizer, and the reply streams the
//              new weights back into the client's buffers;
//   pull       one MasterClient::PullWeights (the client's default dtype);
//   tcp_echo   the floor: a server thread in this process reads exactly the
//              wire bytes of the set (S for fp32, S/2 for the 2-byte types)
//              and writes as many back; TCP_NODELAY, socket buffers left to
//              the kernel's autotuning (which grows them to tcp_rmem's
//              maximum, faster on Linux than a fixed SO_RCVBUF, itself capped
//              at rmem_max) unless --echo_buffer_kib sets them.
//              The same logical round trip with no protocol, no copies into
//              messages and no optimizer.
//
// Two warm-up rounds are not counted; the median and the minimum of
// --iterations rounds are reported, and ratio = median push_pull / median
// tcp_echo (the goal: <= 1.5 at 40 MB fp32), ratio_min the same of
// the minima. A dtype the master or the client refuses is reported as
// "unsupported" with the error, and the run goes on. A benchmark, never a
// test: figures depend on the machine and on whatever else runs on it.
// The master child process is tools/soak/child_process.h's.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cli_flags.h"
#include "common/client/master_client.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "proto/mpilearn.pb.h"
#include "tools/cli/json_text.h"
#include "tools/soak/child_process.h"

ABSL_FLAG(std::string, sizes_mb, "1,10,40",
          "Comma-separated tensor set sizes in MB (1e6 bytes of fp32 values), "
          "each in [1, 1024].");
ABSL_FLAG(std::string, dtypes, "float32,bfloat16,float16",
          "Comma-separated wire dtypes: float32, bfloat16, float16.");
ABSL_FLAG(int, iterations, 20,
          "Timed rounds per size and dtype (after 2 warm-up rounds), in "
          "[1, 10000].");
ABSL_FLAG(bool, json, false,
          "Print one JSON object of the figures instead of the table.");
ABSL_FLAG(std::string, master_bin, "",
          "The mpilearn-master binary (default: from the Bazel runfiles).");
ABSL_FLAG(int, echo_buffer_kib, 0,
          "SO_SNDBUF and SO_RCVBUF of the TCP echo's sockets in KiB; 0 "
          "(default) leaves them to the kernel's autotuning.");
ABSL_FLAG(std::string, transport, "tcp",
          "How the client reaches the master: tcp (loopback, the default) or "
          "unix (the master's --listen_unix socket). The echo is TCP either "
          "way.");
ABSL_FLAG(std::string, optimizer, "sgd",
          "The job's optimizer on the master: sgd or adam (learning rate "
          "1e-6 either way).");

namespace mpilearn {
namespace bench_exchange {
namespace {

constexpr char kUsage[] =
    "bench_exchange: push+pull through a real mpilearn-master vs a raw TCP\n"
    "echo of the same bytes on loopback, per tensor set size and wire dtype.\n"
    "\n"
    "Usage: bench_exchange [--json] [--sizes_mb 1,10,40]\n"
    "           [--dtypes float32,bfloat16,float16] [--iterations 20]\n"
    "           [--optimizer sgd|adam] [--master_bin PATH]\n"
    "           [--echo_buffer_kib N] [--transport tcp|unix]\n"
    "\n"
    "Starts mpilearn-master on a free loopback port (a temporary state\n"
    "directory, removed at exit; the master is stopped at exit or on any\n"
    "error). Per size and dtype it submits a job holding a nine-tensor set\n"
    "shaped like a model's and times, interleaved, after 2 warm-up rounds:\n"
    "  push_pull  MasterClient::PushGradient: the gradient out in the wire\n"
    "             dtype, the master's optimizer step, new weights back;\n"
    "  pull       MasterClient::PullWeights alone;\n"
    "  tcp_echo   the same wire bytes (S, or S/2 for 2-byte dtypes) to an\n"
    "             echo thread in this process and back (TCP_NODELAY).\n"
    "Prints the median (min) of each in ms, ratio = push_pull / tcp_echo\n"
    "of the medians and ratio_min of the minima (less sensitive to other\n"
    "load). A dtype the master refuses is reported as unsupported.\n"
    "\n"
    "Flags:\n"
    "  --sizes_mb    sizes in MB (1e6 bytes of fp32 values), 1..1024\n"
    "                (default 1,10,40).\n"
    "  --dtypes      wire dtypes: float32, bfloat16, float16 (default all).\n"
    "  --iterations  timed rounds per size and dtype (default 20).\n"
    "  --optimizer   the job's optimizer: sgd (default) or adam; lr 1e-6.\n"
    "  --master_bin  the mpilearn-master binary (default: from the Bazel\n"
    "                runfiles, server/mpilearn-master).\n"
    "  --echo_buffer_kib  the echo's socket buffers in KiB (default 0: the\n"
    "                kernel's autotuning, the fastest on Linux).\n"
    "  --transport   tcp (default) or unix: the client talks to the master\n"
    "                over loopback TCP or its Unix socket (--listen_unix).\n"
    "  --json        print one JSON object instead of the table.\n"
    "\n"
    "Exit codes: 0 ok, 1 the master or the exchange failed, 2 usage error.";

constexpr int kWarmupRounds = 2;
constexpr int kMaxSizeMb = 1024;
constexpr int kMaxIterations = 10000;
constexpr double kLearningRate = 1e-6;
constexpr int kMaxEchoBufferKib = 1 << 20;
constexpr uint32_t kSeed = 14;

struct Options {
  std::vector<int> sizes_mb;
  std::vector<v1::DType> dtypes;
  int iterations = 20;
  bool json = false;
  std::string master_bin;
  std::string optimizer;
  int echo_buffer_kib = 0;  // 0: the kernel's autotuning
  bool unix_socket = false;  // --transport unix
};

std::string DTypeLabel(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BFLOAT16:
      return "bfloat16";
    case v1::DTYPE_FLOAT16:
      return "float16";
    default:
      return "float32";
  }
}

size_t WireBytesPerValue(v1::DType dtype) {
  return dtype == v1::DTYPE_FLOAT32 ? 4 : 2;
}

absl::StatusOr<Options> OptionsFromFlags(const char* argv0) {
  Options options;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes_mb), ',', absl::SkipEmpty())) {
    int mb = 0;
    if (!absl::SimpleAtoi(part, &mb) || mb < 1 || mb > kMaxSizeMb) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sizes_mb: expected integers in [1, ", kMaxSizeMb, "], got '",
          part, "'"));
    }
    options.sizes_mb.push_back(mb);
  }
  if (options.sizes_mb.empty()) {
    return absl::InvalidArgumentError("--sizes_mb: give at least one size");
  }
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',', absl::SkipEmpty())) {
    if (part == "float32") {
      options.dtypes.push_back(v1::DTYPE_FLOAT32);
    } else if (part == "bfloat16") {
      options.dtypes.push_back(v1::DTYPE_BFLOAT16);
    } else if (part == "float16") {
      options.dtypes.push_back(v1::DTYPE_FLOAT16);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--dtypes: unknown dtype '", part,
          "'; available: float32, bfloat16, float16"));
    }
  }
  if (options.dtypes.empty()) {
    return absl::InvalidArgumentError("--dtypes: give at least one dtype");
  }
  options.iterations = absl::GetFlag(FLAGS_iterations);
  if (options.iterations < 1 || options.iterations > kMaxIterations) {
    return absl::InvalidArgumentError(
        absl::StrCat("--iterations must be in [1, ", kMaxIterations,
                     "], got ", options.iterations));
  }
  options.json = absl::GetFlag(FLAGS_json);
  options.optimizer = absl::GetFlag(FLAGS_optimizer);
  if (options.optimizer != "sgd" && options.optimizer != "adam") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--optimizer: expected sgd or adam, got '", options.optimizer, "'"));
  }
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "tcp" && transport != "unix") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--transport: expected tcp or unix, got '", transport, "'"));
  }
  options.unix_socket = transport == "unix";
  options.echo_buffer_kib = absl::GetFlag(FLAGS_echo_buffer_kib);
  if (options.echo_buffer_kib < 0 ||
      options.echo_buffer_kib > kMaxEchoBufferKib) {
    return absl::InvalidArgumentError(
        absl::StrCat("--echo_buffer_kib must be in [0, ", kMaxEchoBufferKib,
                     "], got ", options.echo_buffer_kib));
  }
  options.master_bin = absl::GetFlag(FLAGS_master_bin);
  if (options.master_bin.empty()) {
    MPILEARN_ASSIGN_OR_RETURN(options.master_bin, tools::RunfilesMaster(argv0));
  }
  if (access(options.master_bin.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no executable mpilearn-master at '", options.master_bin,
        "'; build //server:mpilearn-master or pass --master_bin"));
  }
  return options;
}

// Sends or receives exactly `bytes` bytes on `fd`.
absl::Status WriteAll(int fd, const char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = send(fd, data, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("echo send: ", std::strerror(errno)));
    }
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = recv(fd, data, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return absl::UnavailableError("echo: peer closed");
    if (n < 0) {
      return absl::UnavailableError(
          absl::StrCat("echo recv: ", std::strerror(errno)));
    }
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// TCP_NODELAY, and socket buffers of `buffer_bytes` unless 0 (autotuning).
void TuneSocket(int fd, int buffer_bytes) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
}

// A TCP echo on loopback within this process: a server thread takes one
// connection and answers each request (an 8-byte length, then that many
// bytes, read in full) with the same number of bytes. RoundTrip is the
// client side. Threading: RoundTrip from one thread at a time; the server
// thread is joined by the destructor (which closes the client socket, ending
// the server's read loop).
class TcpEcho {
 public:
  // `buffer_bytes`: both sides' socket buffers; 0 leaves them to the kernel.
  static absl::StatusOr<std::unique_ptr<TcpEcho>> Start(int buffer_bytes) {
    std::unique_ptr<TcpEcho> echo(new TcpEcho());
    echo->listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (echo->listen_fd_ < 0) {
      return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t length = sizeof(address);
    if (bind(echo->listen_fd_, reinterpret_cast<sockaddr*>(&address),
             sizeof(address)) != 0 ||
        listen(echo->listen_fd_, 1) != 0 ||
        getsockname(echo->listen_fd_, reinterpret_cast<sockaddr*>(&address),
                    &length) != 0) {
      return absl::InternalError(
          absl::StrCat("echo listen: ", std::strerror(errno)));
    }
    echo->server_ = std::thread(
        [fd = echo->listen_fd_, buffer_bytes] { Serve(fd, buffer_bytes); });
    echo->client_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (echo->client_fd_ < 0) {
      return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    }
    TuneSocket(echo->client_fd_, buffer_bytes);
    if (connect(echo->client_fd_, reinterpret_cast<sockaddr*>(&address),
                sizeof(address)) != 0) {
      return absl::InternalError(
          absl::StrCat("echo connect: ", std::strerror(errno)));
    }
    return echo;
  }

  ~TcpEcho() {
    if (client_fd_ >= 0) {
      shutdown(client_fd_, SHUT_RDWR);
      close(client_fd_);
    }
    // Wakes an accept() that never got a connection.
    if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
    if (server_.joinable()) server_.join();
    if (listen_fd_ >= 0) close(listen_fd_);
  }
  TcpEcho(const TcpEcho&) = delete;
  TcpEcho& operator=(const TcpEcho&) = delete;

  // Sends `request` and reads as many bytes back into `reply`.
  absl::Status RoundTrip(absl::Span<const char> request, absl::Span<char> reply) {
    const uint64_t bytes = request.size();
    MPILEARN_RETURN_IF_ERROR(WriteAll(client_fd_,
                                      reinterpret_cast<const char*>(&bytes),
                                      sizeof(bytes)));
    MPILEARN_RETURN_IF_ERROR(WriteAll(client_fd_, request.data(), bytes));
    return ReadAll(client_fd_, reply.data(), std::min<size_t>(bytes, reply.size()));
  }

 private:
  TcpEcho() = default;

  static void Serve(int listen_fd, int buffer_bytes) {
    const int fd = accept(listen_fd, nullptr, nullptr);
    if (fd < 0) return;
    TuneSocket(fd, buffer_bytes);
    std::vector<char> buffer;
    while (true) {
      uint64_t bytes = 0;
      if (!ReadAll(fd, reinterpret_cast<char*>(&bytes), sizeof(bytes)).ok()) {
        break;
      }
      buffer.resize(bytes);
      if (!ReadAll(fd, buffer.data(), bytes).ok() ||
          !WriteAll(fd, buffer.data(), bytes).ok()) {
        break;
      }
    }
    close(fd);
  }

  int listen_fd_ = -1;
  int client_fd_ = -1;
  std::thread server_;
};

// A tensor set shaped like a model's: four weight matrices (of 1024 columns,
// holding about 45%, 30%, 15% and 10% of the values) and five bias-sized
// vectors, `mb` * 1e6 bytes of fp32 values in all (the last vector takes
// what the matrices' whole rows leave).
struct TensorSet {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> values;
  int64_t elements = 0;

  std::vector<absl::Span<const float>> ConstSpans() const {
    return {values.begin(), values.end()};
  }
};

TensorSet MakeTensorSet(int mb) {
  constexpr int64_t kColumns = 1024;
  const int64_t total = int64_t{mb} * 1000000 / 4;
  const std::vector<int64_t> biases = {4096, 2048, 1024, 512};
  int64_t bias_total = 0;
  for (int64_t b : biases) bias_total += b;
  const double shares[] = {0.45, 0.30, 0.15, 0.10};
  const int64_t matrix_budget = total - bias_total - 10;  // keep >= 10 last
  TensorSet set;
  int64_t used = 0;
  for (int i = 0; i < 4; ++i) {
    const int64_t rows = std::max<int64_t>(
        1, static_cast<int64_t>(shares[i] * matrix_budget) / kColumns);
    set.names.push_back(absl::StrCat("layer", i, ".weight"));
    set.shapes.push_back({rows, kColumns});
    used += rows * kColumns;
    set.names.push_back(absl::StrCat("layer", i, ".bias"));
    set.shapes.push_back({biases[i]});
    used += biases[i];
  }
  set.names.push_back("head.bias");
  set.shapes.push_back({std::max<int64_t>(10, total - used)});
  std::mt19937 random(kSeed + mb);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const auto& shape : set.shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(random);
    set.elements += n;
    set.values.push_back(std::move(v));
  }
  return set;
}

struct Timings {
  std::vector<double> ms;
  double Median() const {
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    return n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  }
  double Min() const { return *std::min_element(ms.begin(), ms.end()); }
};

// One (size, dtype) row of the table.
struct Row {
  int mb = 0;
  v1::DType dtype = v1::DTYPE_FLOAT32;
  int64_t fp32_bytes = 0;
  int64_t wire_bytes = 0;
  // Empty when the exchange worked; else why it did not ("unsupported").
  std::string error;
  Timings push_pull;
  Timings pull;
  Timings tcp_echo;
};

double Elapsed(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - start)
      .count();
}

// A job on `master` holding `set` as its weights, ready for pushes.
struct BenchJob {
  std::string job_id;
  std::string group_id;
  uint64_t version = 0;
};

absl::StatusOr<BenchJob> StartJob(MasterClient& master, const Options& options,
                                  const TensorSet& set, v1::DType dtype,
                                  int mb) {
  v1::JobSpec spec;
  spec.set_name(absl::StrCat("bench-exchange-", mb, "mb-", DTypeLabel(dtype)));
  spec.mutable_model()->set_name("mlp");
  // Never read: the benchmark trains nothing; the master does not open them.
  spec.mutable_data()->set_train_images("/nonexistent/train-images.gz");
  spec.mutable_data()->set_train_labels("/nonexistent/train-labels.gz");
  spec.set_algorithm("downpour");
  spec.set_epochs(1);
  spec.set_inband_validation(false);
  spec.mutable_optimizer()->set_name(options.optimizer);
  spec.mutable_optimizer()->set_learning_rate(kLearningRate);
  spec.mutable_exchange()->set_update_dtype(dtype);
  spec.mutable_exchange()->set_weights_dtype(dtype);
  BenchJob job;
  MPILEARN_ASSIGN_OR_RETURN(job.job_id, master.SubmitJob(spec));
  v1::RegisterGroupRequest request;
  request.set_job_id(job.job_id);
  request.set_ranks(1);
  request.set_host("bench_exchange");
  MPILEARN_ASSIGN_OR_RETURN(v1::RegisterGroupResponse registered,
                            master.RegisterGroup(request));
  job.group_id = registered.group_id();
  // The wire format the job asks for, as a worker sets it (a no-op for a
  // client without reduced-precision encoding).
  master.UseWireFormat(registered.spec().exchange());
  const v1::TensorSetHeader header =
      MakeFloat32Header(0, set.names, set.shapes);
  MPILEARN_ASSIGN_OR_RETURN(bool accepted,
                            master.InitWeights(job.job_id, job.group_id, header,
                                               set.ConstSpans()));
  if (!accepted) {
    return absl::InternalError("the master did not take the initial weights");
  }
  return job;
}

// Runs one (size, dtype) row: warm-up, then --iterations interleaved rounds
// of push+pull, pull and TCP echo.
absl::StatusOr<Row> MeasureRow(MasterClient& master, TcpEcho& echo,
                               const Options& options, const TensorSet& set,
                               int mb, v1::DType dtype) {
  Row row;
  row.mb = mb;
  row.dtype = dtype;
  row.fp32_bytes = set.elements * 4;
  row.wire_bytes = set.elements * static_cast<int64_t>(WireBytesPerValue(dtype));

  // The echo's buffers: wire bytes out, as many back.
  std::vector<char> echo_out(static_cast<size_t>(row.wire_bytes), 1);
  std::vector<char> echo_in(static_cast<size_t>(row.wire_bytes));

  // Gradient values: small, representable in every dtype's range.
  std::vector<std::vector<float>> gradient;
  std::vector<std::vector<float>> weights;
  std::mt19937 random(kSeed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (const auto& v : set.values) {
    std::vector<float> g(v.size());
    for (float& x : g) x = normal(random);
    gradient.push_back(std::move(g));
    weights.emplace_back(v.size());
  }
  const std::vector<absl::Span<const float>> gradient_spans(gradient.begin(),
                                                            gradient.end());
  std::vector<absl::Span<float>> weight_spans;
  for (auto& w : weights) weight_spans.push_back(absl::MakeSpan(w));

  absl::StatusOr<BenchJob> job = StartJob(master, options, set, dtype, mb);
  if (!job.ok()) row.error = std::string(job.status().message());

  v1::PushGradientRequest::Header header;
  uint64_t sequence = 0;
  if (job.ok()) {
    header.set_job_id(job->job_id);
    header.set_group_id(job->group_id);
    header.set_rank(0);
    header.set_samples(64);
    header.set_train_loss(1.0);
    header.set_kind(v1::UPDATE_KIND_GRADIENT);
    header.set_reply_dtype(dtype);
    *header.mutable_gradient() = MakeFloat32Header(0, set.names, set.shapes);
    for (auto& info : *header.mutable_gradient()->mutable_tensors()) {
      info.set_dtype(dtype);
    }
  }
  for (int round = 0; round < kWarmupRounds + options.iterations; ++round) {
    const bool timed = round >= kWarmupRounds;
    if (row.error.empty()) {
      header.set_sequence(++sequence);
      header.mutable_gradient()->set_version(job->version);
      auto start = std::chrono::steady_clock::now();
      absl::StatusOr<uint64_t> version =
          master.PushGradient(header, gradient_spans, weight_spans);
      const double push_ms = Elapsed(start);
      if (!version.ok()) {
        row.error = std::string(version.status().message());
      } else {
        job->version = *version;
        start = std::chrono::steady_clock::now();
        version = master.PullWeights(job->job_id, job->group_id, weight_spans);
        const double pull_ms = Elapsed(start);
        if (!version.ok()) {
          return absl::Status(version.status().code(),
                              absl::StrCat("PullWeights: ",
                                           version.status().message()));
        }
        if (timed) {
          row.push_pull.ms.push_back(push_ms);
          row.pull.ms.push_back(pull_ms);
        }
      }
    }
    const auto start = std::chrono::steady_clock::now();
    MPILEARN_RETURN_IF_ERROR(
        echo.RoundTrip(absl::MakeConstSpan(echo_out), absl::MakeSpan(echo_in)));
    if (timed) row.tcp_echo.ms.push_back(Elapsed(start));
  }
  if (!row.error.empty() && dtype == v1::DTYPE_FLOAT32) {
    // fp32 is the exchange's baseline: its failure is the benchmark's.
    return absl::InternalError(absl::StrCat(mb, " MB float32: ", row.error));
  }
  return row;
}

std::string JsonNumber(std::optional<double> value) {
  if (!value.has_value() || !std::isfinite(*value)) return "null";
  return absl::StrFormat("%.4f", *value);
}

using tools::JsonQuoted;

// push_pull / tcp_echo, of the medians (the figure the goal is
// about) or of the minima (less sensitive to load from other processes).
std::optional<double> Ratio(const Row& row, bool median = true) {
  if (!row.error.empty()) return std::nullopt;
  return median ? row.push_pull.Median() / row.tcp_echo.Median()
                : row.push_pull.Min() / row.tcp_echo.Min();
}

void PrintJson(const Options& options, const std::vector<Row>& rows) {
  std::vector<std::string> out_rows;
  std::optional<double> ratio_40mb_fp32;
  for (const Row& row : rows) {
    const bool ok = row.error.empty();
    auto figure = [&](const Timings& t, bool median) -> std::optional<double> {
      if (t.ms.empty()) return std::nullopt;
      return median ? t.Median() : t.Min();
    };
    if (row.mb == 40 && row.dtype == v1::DTYPE_FLOAT32) ratio_40mb_fp32 = Ratio(row);
    out_rows.push_back(absl::StrCat(
        "{\"mb\": ", row.mb, ", \"dtype\": ", JsonQuoted(DTypeLabel(row.dtype)),
        ", \"status\": ", JsonQuoted(ok ? "ok" : "unsupported"),
        ", \"fp32_bytes\": ", row.fp32_bytes,
        ", \"wire_bytes\": ", row.wire_bytes,
        ", \"push_pull_ms\": ", JsonNumber(figure(row.push_pull, true)),
        ", \"push_pull_min_ms\": ", JsonNumber(figure(row.push_pull, false)),
        ", \"pull_ms\": ", JsonNumber(figure(row.pull, true)),
        ", \"pull_min_ms\": ", JsonNumber(figure(row.pull, false)),
        ", \"tcp_echo_ms\": ", JsonNumber(figure(row.tcp_echo, true)),
        ", \"tcp_echo_min_ms\": ", JsonNumber(figure(row.tcp_echo, false)),
        ", \"ratio\": ", JsonNumber(Ratio(row)),
        ", \"ratio_min\": ", JsonNumber(Ratio(row, false)),
        ok ? "" : absl::StrCat(", \"error\": ", JsonQuoted(row.error)), "}"));
  }
  std::vector<std::string> dtypes;
  for (v1::DType dtype : options.dtypes) dtypes.push_back(JsonQuoted(DTypeLabel(dtype)));
  std::printf(
      "{\"sizes_mb\": [%s], \"dtypes\": [%s], \"iterations\": %d, "
      "\"warmup\": %d, \"optimizer\": %s, \"learning_rate\": %g, "
      "\"echo_buffer_kib\": %d, \"transport\": \"%s\", "
      "\"rows\": [\n  %s\n], \"ratio_40mb_fp32\": %s}\n",
      absl::StrJoin(options.sizes_mb, ", ").c_str(),
      absl::StrJoin(dtypes, ", ").c_str(), options.iterations, kWarmupRounds,
      JsonQuoted(options.optimizer).c_str(), kLearningRate,
      options.echo_buffer_kib, options.unix_socket ? "unix" : "tcp",
      absl::StrJoin(out_rows, ",\n  ").c_str(),
      JsonNumber(ratio_40mb_fp32).c_str());
}

void PrintTable(const Options& options, const std::vector<Row>& rows) {
  std::printf(
      "push+pull through mpilearn-master (optimizer %s, lr %g) vs TCP echo of "
      "the wire bytes on loopback; median (min) of %d rounds, ms\n",
      options.optimizer.c_str(), kLearningRate, options.iterations);
  std::printf("%6s %-9s %10s %19s %19s %19s %7s %9s\n", "MB", "dtype",
              "wire MB", "push_pull_ms", "pull_ms", "tcp_echo_ms", "ratio",
              "ratio_min");
  auto cell = [](const Timings& t) {
    return absl::StrFormat("%8.2f (%8.2f)", t.Median(), t.Min());
  };
  std::vector<std::string> errors;
  for (const Row& row : rows) {
    if (!row.error.empty()) {
      std::printf("%6d %-9s %10.2f %19s %19s %19s %7s %9s\n", row.mb,
                  DTypeLabel(row.dtype).c_str(), row.wire_bytes / 1e6,
                  "unsupported", "-", cell(row.tcp_echo).c_str(), "-", "-");
      errors.push_back(absl::StrCat(row.mb, " MB ", DTypeLabel(row.dtype),
                                    ": ", row.error));
      continue;
    }
    std::printf("%6d %-9s %10.2f %19s %19s %19s %7.2f %9.2f\n", row.mb,
                DTypeLabel(row.dtype).c_str(), row.wire_bytes / 1e6,
                cell(row.push_pull).c_str(), cell(row.pull).c_str(),
                cell(row.tcp_echo).c_str(), *Ratio(row), *Ratio(row, false));
  }
  for (const std::string& error : errors) {
    std::printf("unsupported: %s\n", error.c_str());
  }
}

absl::Status Run(const Options& options) {
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<tools::TempDir> dir,
                            tools::TempDir::Create("bench_exchange"));
  const std::string port_file = dir->path() + "/port";
  const std::string socket = dir->path() + "/master.sock";
  std::vector<std::string> args = {
      options.master_bin,
      "--listen=127.0.0.1:0",
      absl::StrCat("--port_file=", port_file),
      absl::StrCat("--state_dir=", dir->path(), "/state"),
      "--metrics_listen=",
      "--device=cpu",
  };
  if (options.unix_socket) {
    args.push_back(absl::StrCat("--listen_unix=", socket));
  }
  // Ended (SIGTERM, SIGKILL after 10 s) before `dir` is removed.
  MPILEARN_ASSIGN_OR_RETURN(
      std::unique_ptr<tools::MasterChild> process,
      tools::MasterChild::Start(options.master_bin, std::move(args), port_file,
                                dir->path() + "/master.log"));
  MPILEARN_ASSIGN_OR_RETURN(
      std::unique_ptr<MasterClient> master,
      MasterClient::Connect(options.unix_socket
                                ? absl::StrCat("unix:", socket)
                                : absl::StrCat("127.0.0.1:", process->port())));
  MPILEARN_ASSIGN_OR_RETURN(std::unique_ptr<TcpEcho> echo,
                            TcpEcho::Start(options.echo_buffer_kib * 1024));
  std::vector<Row> rows;
  for (int mb : options.sizes_mb) {
    const TensorSet set = MakeTensorSet(mb);
    for (v1::DType dtype : options.dtypes) {
      if (!options.json) {
        std::fprintf(stderr, "bench_exchange: %d MB %s...\n", mb,
                     DTypeLabel(dtype).c_str());
      }
      absl::StatusOr<Row> row = MeasureRow(*master, *echo, options, set, mb, dtype);
      if (!row.ok()) {
        return absl::Status(row.status().code(),
                            absl::StrCat(row.status().message(),
                                         "\nmpilearn-master's log ends:\n",
                                         process->LogTail()));
      }
      rows.push_back(*std::move(row));
    }
  }
  if (options.json) {
    PrintJson(options, rows);
  } else {
    PrintTable(options, rows);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace bench_exchange
}  // namespace mpilearn

int main(int argc, char** argv) {
  namespace be = mpilearn::bench_exchange;
  absl::StatusOr<be::Options> options;
  mpilearn::ToolMain tool;
  tool.name = "bench_exchange";
  tool.usage = be::kUsage;
  tool.flags_source = "tools/bench/bench_exchange.cc";
  tool.read_flags = [&] {
    options = be::OptionsFromFlags(argv[0]);
    return options.status();
  };
  tool.run = [&] { return be::Run(*options); };
  return mpilearn::RunToolMain(argc, argv, tool);
}
