// The exchanges against independent double-precision computations, with a
// fake group (ranks on threads) and a fake master (plain SGD, elastic and
// delta rules; worker/fake_master.h). The model is a torch::nn::Linear(3, 2)
// trained on a summed 0.5 * squared error, whose gradient the reference
// computes by hand. Over 500 lines: the four algorithms share the toy model
// and its reference gradient, which keeps their tests in one file.
#include "worker/exchange.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "common/error_reason.h"
#include "common/shard/placement.h"
#include "common/shard/sharded_connection.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"
#include "worker/fake_collectives.h"
#include "worker/fake_master.h"
#include "worker/mpi_group.h"

namespace mpilearn::worker {
namespace {

constexpr int kInputs = 3;
constexpr int kOutputs = 2;
constexpr int kParams = kOutputs * kInputs + kOutputs;  // weight, then bias
using Params = std::array<double, kParams>;

// Sample s of the toy data set: inputs and targets, as the float values the
// model sees (the reference reads the same floats).
std::array<float, kInputs> Input(int s) {
  return {static_cast<float>(std::sin(s + 1.0)),
          static_cast<float>(std::cos(2.0 * s + 1.0)),
          static_cast<float>(0.1 * s - 0.5)};
}
std::array<float, kOutputs> Target(int s) {
  return {static_cast<float>(0.3 * s - 1.0), static_cast<float>(std::sin(3.0 * s))};
}

// The reference: d/dp of sum over samples [begin, end) of 0.5 |W x + b - t|^2.
Params Gradient(const Params& p, int begin, int end) {
  Params g{};
  for (int s = begin; s < end; ++s) {
    const std::array<float, kInputs> x = Input(s);
    const std::array<float, kOutputs> t = Target(s);
    for (int o = 0; o < kOutputs; ++o) {
      double y = p[kOutputs * kInputs + o];
      for (int i = 0; i < kInputs; ++i) y += p[o * kInputs + i] * x[i];
      const double r = y - t[o];
      for (int i = 0; i < kInputs; ++i) g[o * kInputs + i] += r * x[i];
      g[kOutputs * kInputs + o] += r;
    }
  }
  return g;
}

const std::vector<float> kStart = {0.2f, -0.1f, 0.4f, 0.05f, 0.3f, -0.25f, 0.1f, -0.2f};

Params ToParams(const std::vector<float>& flat) {
  Params p{};
  std::copy(flat.begin(), flat.end(), p.begin());
  return p;
}

// The fake master's layout: weight (6), bias (2).
std::vector<std::vector<float>> AsTensors(const std::vector<float>& flat) {
  return {std::vector<float>(flat.begin(), flat.begin() + kOutputs * kInputs),
          std::vector<float>(flat.begin() + kOutputs * kInputs, flat.end())};
}
std::vector<float> Flat(const std::vector<std::vector<float>>& tensors) {
  std::vector<float> flat;
  for (const auto& t : tensors) flat.insert(flat.end(), t.begin(), t.end());
  return flat;
}

void ExpectNear(const std::vector<float>& actual, const Params& expected,
                const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t k = 0; k < expected.size(); ++k) {
    EXPECT_NEAR(actual[k], expected[k], 1e-6 + 1e-5 * std::fabs(expected[k]))
        << what << " [" << k << "]";
  }
}

// One rank: its model, wired to its exchange's context.
class RankRig {
 public:
  // `mirror`: the exchange works on host copies of the model's state, as
  // for a model on a GPU.
  RankRig(Collectives& group, MasterConnection& master,
          const std::vector<float>& start, bool mirror = false)
      : context_(group, master, "job-1", "group-1", nullptr),
        linear_(kInputs, kOutputs) {
    SetWeights(start);
    AttachParameters(context_, {linear_->weight, linear_->bias}, {"weight", "bias"},
                     2, mirror);
  }

  ExchangeContext& context() { return context_; }

  // A batch's forward and backward pass: the summed loss over samples
  // [begin, end) adds its gradient to the parameters' gradients.
  void Backward(int begin, int end) {
    std::vector<float> xs, ts;
    for (int s = begin; s < end; ++s) {
      for (float v : Input(s)) xs.push_back(v);
      for (float v : Target(s)) ts.push_back(v);
    }
    const int64_t n = end - begin;
    torch::Tensor x = torch::tensor(xs).reshape({n, kInputs});
    torch::Tensor t = torch::tensor(ts).reshape({n, kOutputs});
    torch::Tensor loss = 0.5 * (linear_->forward(x) - t).pow(2).sum();
    loss.backward();
  }

  // The model's own weights (not the exchange's views of them).
  std::vector<float> Weights() const {
    std::vector<float> flat;
    for (const torch::Tensor& t : {linear_->weight, linear_->bias}) {
      const float* data = t.data_ptr<float>();
      flat.insert(flat.end(), data, data + t.numel());
    }
    return flat;
  }

  void SetWeights(const std::vector<float>& flat) {
    torch::NoGradGuard no_grad;
    std::copy(flat.begin(), flat.begin() + kOutputs * kInputs,
              linear_->weight.data_ptr<float>());
    std::copy(flat.begin() + kOutputs * kInputs, flat.end(),
              linear_->bias.data_ptr<float>());
  }

 private:
  ExchangeContext context_;
  torch::nn::Linear linear_;
};

// "easgd", or "easgd_adam": easgd whose ranks step with adam ("gem_adam",
// "gem_sgd": gem with that worker optimizer).
v1::JobSpec SpecFor(const std::string& variant) {
  const size_t under = variant.find('_');
  const std::string algorithm = variant.substr(0, under);
  v1::JobSpec spec;
  spec.set_algorithm(algorithm);
  spec.mutable_easgd()->set_alpha(0.25);
  v1::OptimizerSpec* local = spec.mutable_easgd()->mutable_worker_optimizer();
  local->set_name("sgd");
  local->set_learning_rate(0.05);
  local->set_momentum(0.0);
  spec.mutable_gem()->set_learning_rate(0.1);
  spec.mutable_gem()->set_momentum(0.9);
  spec.mutable_gem()->set_kappa(2.0);
  if (under == std::string::npos) return spec;
  if (algorithm == "gem") local = spec.mutable_gem()->mutable_worker_optimizer();
  local->Clear();
  local->set_name(variant.substr(under + 1));
  if (local->name() == "adam") {
    local->set_learning_rate(0.02);
    local->set_beta1(0.8);
    local->set_beta2(0.9);
    local->set_epsilon(1e-3);
  } else {
    local->set_learning_rate(0.05);
    local->set_momentum(0.5);
    local->set_nesterov(true);
  }
  local->set_weight_decay(0.01);
  return spec;
}

// A rank's own optimizer in doubles, PyTorch's rules (SGD's and Adam's
// documented updates): the step for mean gradient `g` at weights `w`.
struct LocalReference {
  explicit LocalReference(const v1::OptimizerSpec& spec) : spec(spec) {}
  Params Step(const Params& w, Params g) {
    ++t;
    Params u{};
    for (int k = 0; k < kParams; ++k) {
      g[k] += spec.weight_decay() * w[k];
      if (spec.name() == "adam") {
        m1[k] = spec.beta1() * m1[k] + (1 - spec.beta1()) * g[k];
        m2[k] = spec.beta2() * m2[k] + (1 - spec.beta2()) * g[k] * g[k];
        const double m1_hat = m1[k] / (1 - std::pow(spec.beta1(), t));
        const double m2_hat = m2[k] / (1 - std::pow(spec.beta2(), t));
        u[k] = -spec.learning_rate() * m1_hat / (std::sqrt(m2_hat) + spec.epsilon());
      } else {
        m1[k] = spec.momentum() * m1[k] + g[k];
        u[k] = -spec.learning_rate() * (spec.nesterov() ? g[k] + spec.momentum() * m1[k] : m1[k]);
      }
    }
    return u;
  }
  const v1::OptimizerSpec spec;
  Params m1{}, m2{};
  int t = 0;
};

constexpr float kMasterLearningRate = 0.1f;

FakeMaster::Rules MasterRules() {
  return {kMasterLearningRate, /*alpha=*/0.25f};
}

// ---------------------------------------------------------------------------
// sync_every accumulation, every algorithm: two windows, the first of two
// batches (2 and 3 samples), the second of one (4 samples), on one rank.

struct Window {
  std::vector<std::pair<int, int>> batches;  // sample ranges
  int samples() const {
    int n = 0;
    for (const auto& [begin, end] : batches) n += end - begin;
    return n;
  }
};
const std::vector<Window> kWindows = {{{{0, 2}, {2, 5}}}, {{{5, 9}}}};

// What the master and the rank hold after kWindows, computed in doubles.
struct Outcome {
  Params master, rank;
};

Outcome Reference(const std::string& variant) {
  const v1::JobSpec spec = SpecFor(variant);
  const std::string algorithm = spec.algorithm();
  Params x = ToParams(kStart), c = x, moment{}, last = x;
  LocalReference easgd_local(spec.easgd().worker_optimizer());
  std::optional<LocalReference> gem_local;
  if (spec.gem().has_worker_optimizer()) gem_local.emplace(spec.gem().worker_optimizer());
  for (const Window& window : kWindows) {
    const double n = window.samples();
    if (algorithm == "easgd") {
      for (const auto& [begin, end] : window.batches) {
        Params g = Gradient(x, begin, end);
        for (int k = 0; k < kParams; ++k) g[k] /= (end - begin);
        const Params u = easgd_local.Step(x, g);
        for (int k = 0; k < kParams; ++k) x[k] += u[k];
      }
      const double alpha = spec.easgd().alpha();
      for (int k = 0; k < kParams; ++k) {
        const double centre = c[k];
        c[k] += alpha * (x[k] - centre);
        x[k] -= alpha * (x[k] - centre);
      }
      continue;
    }
    // The others: gradients of the window's batches, all at x, add up and
    // are divided once by the window's samples.
    Params g{};
    for (const auto& [begin, end] : window.batches) {
      const Params batch = Gradient(x, begin, end);
      for (int k = 0; k < kParams; ++k) g[k] += batch[k];
    }
    for (int k = 0; k < kParams; ++k) g[k] /= n;
    if (algorithm == "gem") {
      const double lr = spec.gem().learning_rate();
      const Params local = gem_local.has_value() ? gem_local->Step(x, g) : Params{};
      for (int k = 0; k < kParams; ++k) {
        const double u = gem_local.has_value() ? local[k] : -lr * g[k];
        moment[k] = spec.gem().momentum() * moment[k] + u;
        const double moved = x[k] - last[k];
        last[k] = x[k];
        const double pi = std::clamp(
            (spec.gem().kappa() * std::fabs(moment[k]) - std::fabs(moved)) /
                std::fabs(u + 1e-12),
            0.0, 5.0);
        c[k] += u * pi;
      }
    } else {  // downpour, sync: plain SGD on the master
      for (int k = 0; k < kParams; ++k) c[k] -= kMasterLearningRate * g[k];
    }
    x = c;
  }
  return {c, x};
}

// `shards` fake masters each holding its slice of `whole` (per tensor) as
// `placement` places it, behind a ShardedConnection.
struct ShardRig {
  ShardRig(const std::vector<std::vector<float>>& whole, int shards)
      : lead(MasterRules()),
        placement(*shard::PlaceTensors({kOutputs * kInputs, kOutputs}, shards,
                                       /*split_elements=*/3)) {
    std::vector<MasterConnection*> connections;
    for (int s = 0; s < shards; ++s) {
      masters.push_back(std::make_unique<FakeMaster>(MasterRules()));
      std::vector<std::vector<float>> slice;
      for (const shard::TensorRange& r : placement.shards[s]) {
        slice.emplace_back(whole[r.tensor].begin() + r.begin, whole[r.tensor].begin() + r.end);
      }
      masters.back()->SetWeights(slice);
      connections.push_back(masters.back().get());
    }
    connection = std::make_unique<shard::ShardedConnection>(lead, connections, placement);
  }
  // The shards' slices put together.
  std::vector<std::vector<float>> Whole() const {
    std::vector<std::vector<float>> whole = {std::vector<float>(kOutputs * kInputs),
                                             std::vector<float>(kOutputs)};
    for (size_t s = 0; s < masters.size(); ++s) {
      const std::vector<std::vector<float>> slice = masters[s]->weights();
      for (size_t i = 0; i < slice.size(); ++i) {
        const shard::TensorRange& r = placement.shards[s][i];
        std::copy(slice[i].begin(), slice[i].end(), whole[r.tensor].begin() + r.begin);
      }
    }
    return whole;
  }

  FakeMaster lead;  // takes no weight calls
  shard::Placement placement;
  std::vector<std::unique_ptr<FakeMaster>> masters;
  std::unique_ptr<shard::ShardedConnection> connection;
};

// Runs kWindows through `algorithm`'s exchange and checks the master's and
// the rank's weights against Reference. With `shards` > 1 the master is
// that many fake shards behind a ShardedConnection, each tensor split into
// ranges of at most 3 elements: every rule applied slice by slice must
// give the whole model's result.
void CheckAccumulation(const std::string& algorithm, bool mirror, int shards = 1) {
  FakeGroup group(1);
  FakeMaster single(MasterRules());
  single.SetWeights(AsTensors(kStart));
  ShardRig sharded(AsTensors(kStart), shards);
  MasterConnection& connection =
      shards > 1 ? static_cast<MasterConnection&>(*sharded.connection) : single;
  FakeMaster& master = shards > 1 ? *sharded.masters[0] : single;
  RankRig rig(group.rank(0), connection, kStart, mirror);
  EXPECT_EQ(rig.context().mirrored, mirror);
  absl::StatusOr<std::unique_ptr<Exchange>> exchange =
      MakeExchange(SpecFor(algorithm), rig.context());
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  ASSERT_TRUE((*exchange)->Start().ok());
  for (const Window& window : kWindows) {
    for (const auto& [begin, end] : window.batches) {
      rig.Backward(begin, end);
      (*exchange)->AfterBatch(end - begin);
    }
    ASSERT_TRUE((*exchange)->EndWindow(window.samples()).ok());
  }

  const Outcome expected = Reference(algorithm);
  ExpectNear(Flat(shards > 1 ? sharded.Whole() : single.weights()), expected.master, "master");
  ExpectNear(rig.Weights(), expected.rank, "rank");
  // Every shard saw every window, on its own base version.
  const std::vector<FakeMaster::Push> pushes = master.pushes();
  ASSERT_EQ(pushes.size(), kWindows.size());
  for (size_t w = 0; w < kWindows.size(); ++w) {
    EXPECT_EQ(pushes[w].header.samples(),
              static_cast<uint64_t>(kWindows[w].samples()));
    EXPECT_EQ(pushes[w].header.gradient().version(), w);  // the reply's
  }
  // The version a sharded connection reports sums the shards'.
  EXPECT_EQ(rig.context().version, kWindows.size() * shards);
  EXPECT_EQ((*exchange)->keeps_local_weights(), SpecFor(algorithm).algorithm() == "easgd");
}

class AccumulationTest : public testing::TestWithParam<std::string> {};

TEST_P(AccumulationTest, WindowGradientsAddUpAndDivideOnce) {
  CheckAccumulation(GetParam(), /*mirror=*/false);
}

// The path a GPU model takes: the exchange reads and writes host copies,
// and the model's tensors receive what it wrote.
TEST_P(AccumulationTest, SameThroughHostCopiesOfTheState) {
  CheckAccumulation(GetParam(), /*mirror=*/true);
}

// The same through three parameter shards.
TEST_P(AccumulationTest, SameThroughThreeShards) {
  CheckAccumulation(GetParam(), /*mirror=*/false, /*shards=*/3);
}

INSTANTIATE_TEST_SUITE_P(EveryAlgorithm, AccumulationTest,
                         testing::Values("downpour", "sync", "easgd", "gem", "easgd_adam",
                                         "easgd_sgd", "gem_adam", "gem_sgd"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(ExchangeTest, PushKindFollowsTheAlgorithm) {
  const std::vector<std::pair<std::string, v1::UpdateKind>> cases = {
      {"", v1::UPDATE_KIND_GRADIENT},  // the default algorithm, downpour
      {"downpour", v1::UPDATE_KIND_GRADIENT},
      {"sync", v1::UPDATE_KIND_GRADIENT},
      {"easgd", v1::UPDATE_KIND_ELASTIC},
      {"gem", v1::UPDATE_KIND_DELTA}};
  for (const auto& [algorithm, kind] : cases) {
    FakeGroup group(1);
    FakeMaster master(MasterRules());
    master.SetWeights(AsTensors(kStart));
    RankRig rig(group.rank(0), master, kStart);
    auto exchange = MakeExchange(SpecFor(algorithm), rig.context());
    ASSERT_TRUE(exchange.ok()) << algorithm;
    ASSERT_TRUE((*exchange)->Start().ok());
    rig.Backward(0, 3);
    (*exchange)->AfterBatch(3);
    ASSERT_TRUE((*exchange)->EndWindow(3).ok());
    ASSERT_EQ(master.pushes().size(), 1u) << algorithm;
    const v1::PushGradientRequest::Header header = master.pushes()[0].header;
    EXPECT_EQ(header.kind(), kind) << algorithm;
    EXPECT_EQ(header.job_id(), "job-1");
    EXPECT_EQ(header.group_id(), "group-1");
    EXPECT_EQ(header.gradient().tensors_size(), 2);
  }
}

TEST(ExchangeTest, UnknownAlgorithmIsRefused) {
  FakeGroup group(1);
  FakeMaster master(MasterRules());
  RankRig rig(group.rank(0), master, kStart);
  auto exchange = MakeExchange(SpecFor("hogwild"), rig.context());
  EXPECT_EQ(exchange.status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// sync: the mean over the group's samples, not a sum, with unequal shares.

TEST(SyncExchangeTest, AveragesOverSamplesAcrossRanks) {
  // Rank r trains these sample ranges in one window: 2, 4 (two batches) and
  // 1 samples.
  const std::vector<std::vector<std::pair<int, int>>> shares = {
      {{0, 2}}, {{2, 5}, {5, 6}}, {{6, 7}}};
  FakeGroup group(3);
  FakeMaster master(MasterRules());
  master.SetWeights(AsTensors(kStart));
  std::vector<std::vector<float>> after(3);
  std::vector<absl::Status> outcome(3);
  group.Run([&](Collectives& rank) {
    RankRig rig(rank, master, kStart);
    auto exchange = MakeExchange(SpecFor("sync"), rig.context());
    if (!exchange.ok()) {
      outcome[rank.rank()] = exchange.status();
      return;
    }
    (*exchange)->Start().IgnoreError();
    int samples = 0;
    for (const auto& [begin, end] : shares[rank.rank()]) {
      rig.Backward(begin, end);
      (*exchange)->AfterBatch(end - begin);
      samples += end - begin;
    }
    outcome[rank.rank()] = (*exchange)->EndWindow(samples);
    after[rank.rank()] = rig.Weights();
  });
  for (const absl::Status& status : outcome) ASSERT_TRUE(status.ok()) << status;

  // Reference: the sum of every sample's gradient over 7 samples.
  const Params start = ToParams(kStart);
  const Params sum = Gradient(start, 0, 7);
  Params expected = start;
  for (int k = 0; k < kParams; ++k) expected[k] -= kMasterLearningRate * sum[k] / 7.0;
  ExpectNear(Flat(master.weights()), expected, "master");
  for (int r = 0; r < 3; ++r) {
    ExpectNear(after[r], expected, "rank " + std::to_string(r));
  }
  // One push, by the leader, counting the group's samples.
  const std::vector<FakeMaster::Push> pushes = master.pushes();
  ASSERT_EQ(pushes.size(), 1u);
  EXPECT_EQ(pushes[0].header.rank(), 0);
  EXPECT_EQ(pushes[0].header.samples(), 7u);
  for (int k = 0; k < kParams; ++k) {
    const float pushed = Flat(pushes[0].payload)[k];
    EXPECT_NEAR(pushed, sum[k] / 7.0, 1e-6 + 1e-5 * std::fabs(sum[k] / 7.0));
  }
}

TEST(SyncExchangeTest, LeaderFailureReachesEveryRankWithItsReason) {
  FakeGroup group(3);
  FakeMaster master(MasterRules());
  master.SetWeights(AsTensors(kStart));
  master.FailNextPush(WithReason(absl::FailedPreconditionError("job ended"),
                                 v1::ERROR_REASON_JOB_ENDED));
  std::vector<absl::Status> outcome(3);
  std::vector<bool> together(3);
  group.Run([&](Collectives& rank) {
    RankRig rig(rank, master, kStart);
    auto exchange = MakeExchange(SpecFor("sync"), rig.context());
    rig.Backward(rank.rank(), rank.rank() + 1);
    (*exchange)->AfterBatch(1);
    outcome[rank.rank()] = (*exchange)->EndWindow(1);
    together[rank.rank()] = rig.context().failed_together;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(outcome[r].code(), absl::StatusCode::kFailedPrecondition) << r;
    EXPECT_EQ(ReasonOf(outcome[r]), v1::ERROR_REASON_JOB_ENDED) << r;
    EXPECT_TRUE(together[r]) << r;
  }
  EXPECT_EQ(outcome[0].message(), "job ended");
  EXPECT_EQ(outcome[1].message(), "the leader failed: job ended");
}

// ---------------------------------------------------------------------------
// GEM's scaling, on a hand-made gradient and centre movement.

// One rank whose model is a single parameter tensor `p`, starting at `w0`
// like the FakeMaster's centre.
struct SingleParameterRig {
  explicit SingleParameterRig(const std::vector<float>& w0)
      : master(MasterRules()),
        context(group.rank(0), master, "job-1", "group-1", nullptr),
        p(torch::tensor(w0).requires_grad_()) {
    master.SetWeights({w0});
    AttachParameters(context, {p}, {"p"}, 1);
  }

  // Another rank moved the master's centre to `centre`, and this rank's
  // weights hold it (as the next push's reply would bring it).
  void MoveCentre(const std::vector<float>& centre) {
    master.SetWeights({centre});
    torch::NoGradGuard no_grad;
    std::copy(centre.begin(), centre.end(), p.data_ptr<float>());
  }

  FakeGroup group{1};
  FakeMaster master;
  ExchangeContext context;
  torch::Tensor p;
};

TEST(GemExchangeTest, ScalesTheUpdateByEnergyMatching) {
  const double lr = 0.1, momentum = 0.9, kappa = 1.0;
  v1::JobSpec spec = SpecFor("gem");
  spec.mutable_gem()->set_learning_rate(lr);
  spec.mutable_gem()->set_momentum(momentum);
  spec.mutable_gem()->set_kappa(kappa);

  const std::vector<float> w0 = {0.5f, -0.3f, 0.2f, 1.0f, -1.0f, 0.0f};
  // Summed gradients of two windows (2 and 4 samples), and how far the
  // centre moved between them. In window 2 the elements land on pi's upper
  // clip, in between, on the lower clip, in between, in between, and u = 0.
  const std::vector<float> g1 = {4, 2, -6, 1, 0.5f, -2};
  const std::vector<float> g2 = {0.4f, 4, -8, 2, -4, 0};
  const std::vector<float> moved = {0, 0.05f, 1.0f, 0.02f, 0, 0.01f};
  const double n1 = 2, n2 = 4;

  SingleParameterRig rig(w0);
  FakeMaster& master = rig.master;
  torch::Tensor& p = rig.p;
  auto exchange = MakeExchange(spec, rig.context);
  ASSERT_TRUE(exchange.ok());
  ASSERT_TRUE((*exchange)->Start().ok());

  p.mutable_grad() = torch::tensor(g1);
  ASSERT_TRUE((*exchange)->EndWindow(n1).ok());
  // Another rank moved the centre: the next reply (here set directly)
  // brings w1 = w0 + moved.
  std::vector<float> w1(w0.size());
  for (size_t k = 0; k < w0.size(); ++k) w1[k] = w0[k] + moved[k];
  rig.MoveCentre(w1);
  // Window 2 in two batches: the gradients add up.
  std::vector<float> half(g2.size());
  for (size_t k = 0; k < g2.size(); ++k) half[k] = g2[k] / 2;
  p.mutable_grad() = torch::tensor(half);
  (*exchange)->AfterBatch(2);
  p.mutable_grad().add_(torch::tensor(half));
  (*exchange)->AfterBatch(2);
  ASSERT_TRUE((*exchange)->EndWindow(n2).ok());

  // The reference, in doubles.
  std::vector<double> m(w0.size(), 0.0), d1(w0.size()), d2(w0.size());
  auto pi_of = [&](double u, double mk, double centre_moved) {
    return std::clamp((kappa * std::fabs(mk) - std::fabs(centre_moved)) /
                          std::fabs(u + 1e-12),
                      0.0, 5.0);
  };
  for (size_t k = 0; k < w0.size(); ++k) {
    const double u1 = -lr * g1[k] / n1;
    m[k] = u1;
    d1[k] = u1 * pi_of(u1, m[k], 0.0);
    const double u2 = -lr * g2[k] / n2;
    m[k] = momentum * m[k] + u2;
    d2[k] = u2 * pi_of(u2, m[k], static_cast<double>(w1[k]) - w0[k]);
  }
  // Window 2's factors, worked by hand: 5 (clipped from 19), 1.4, 0
  // (clipped), 1.5, 0.775, and 0 for u = 0.
  const std::vector<double> pi2 = {5, 1.4, 0, 1.5, 0.775, 5};
  for (size_t k = 0; k < w0.size(); ++k) {
    const double u2 = -lr * g2[k] / n2;
    EXPECT_NEAR(d2[k], u2 * pi2[k], 1e-6) << k;
  }

  const std::vector<FakeMaster::Push> pushes = master.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  for (size_t k = 0; k < w0.size(); ++k) {
    EXPECT_NEAR(pushes[0].payload[0][k], d1[k], 1e-6 + 1e-5 * std::fabs(d1[k])) << k;
    EXPECT_NEAR(pushes[1].payload[0][k], d2[k], 1e-6 + 1e-5 * std::fabs(d2[k])) << k;
    const double final_weight = w1[k] + d2[k];
    EXPECT_NEAR(master.weights()[0][k], final_weight, 1e-6) << k;
    EXPECT_NEAR(p.data_ptr<float>()[k], final_weight, 1e-6) << k;
  }
  EXPECT_EQ(pushes[0].header.kind(), v1::UPDATE_KIND_DELTA);
  EXPECT_EQ(pushes[1].header.samples(), 4u);
}

// GEM over several exchanges, as the paper's worker runs: the master adds
// each delta, another rank moves the centre between exchanges, and the
// movement the rank subtracts from its proxy's budget is the whole
// collective one (its own previous delta plus the other rank's). Checked
// against the recurrence in doubles.
TEST(GemExchangeTest, MatchesTheCollectiveMovementOverExchanges) {
  const double lr = 0.05, momentum = 0.99, kappa = 1.0;
  v1::JobSpec spec = SpecFor("gem");
  spec.mutable_gem()->set_learning_rate(lr);
  spec.mutable_gem()->set_momentum(momentum);
  spec.mutable_gem()->set_kappa(kappa);

  const std::vector<float> w0 = {0.5f, -0.3f, 0.2f, 1.0f};
  // Per window: the summed gradient of 2 samples, then what the other rank
  // adds to the centre after the push.
  const std::vector<std::vector<float>> grads = {
      {1.0f, -2.0f, 0.5f, 3.0f},
      {1.2f, -1.0f, -0.5f, 3.0f},
      {0.8f, -3.0f, 0.4f, -1.0f},
      {1.0f, -2.5f, 0.6f, 2.0f},
      {0.9f, 2.0f, 0.5f, 2.5f}};
  const std::vector<std::vector<float>> others = {
      {0.0f, 0.01f, -0.02f, 0.0f},
      {-0.01f, 0.02f, 0.0f, -0.05f},
      {0.02f, -0.01f, 0.01f, 0.0f},
      {0.0f, 0.0f, -0.01f, 0.03f},
      {0.0f, 0.0f, 0.0f, 0.0f}};
  const double samples = 2;

  SingleParameterRig rig(w0);
  FakeMaster& master = rig.master;
  torch::Tensor& p = rig.p;
  auto exchange = MakeExchange(spec, rig.context);
  ASSERT_TRUE(exchange.ok());
  ASSERT_TRUE((*exchange)->Start().ok());

  // The reference: the centre c, the rank's copy of the centre at its
  // previous exchange, and the proxy's momentum, all in doubles.
  const size_t n = w0.size();
  std::vector<double> c(w0.begin(), w0.end()), last = c, m(n, 0.0);
  std::vector<std::vector<double>> expected;
  for (size_t t = 0; t < grads.size(); ++t) {
    p.mutable_grad() = torch::tensor(grads[t]);
    ASSERT_TRUE((*exchange)->EndWindow(samples).ok());

    std::vector<double> d(n);
    for (size_t k = 0; k < n; ++k) {
      const double u = -lr * grads[t][k] / samples;
      m[k] = momentum * m[k] + u;
      const double moved = c[k] - last[k];
      last[k] = c[k];
      const double pi = std::clamp(
          (kappa * std::fabs(m[k]) - std::fabs(moved)) / std::fabs(u), 0.0, 5.0);
      d[k] = pi * u;
      c[k] += d[k] + others[t][k];
    }
    expected.push_back(d);
    // The other rank's push lands on the master and reaches this rank with
    // its next reply (set directly here).
    std::vector<float> moved_centre = master.weights()[0];
    for (size_t k = 0; k < n; ++k) moved_centre[k] += others[t][k];
    rig.MoveCentre(moved_centre);
  }

  const std::vector<FakeMaster::Push> pushes = master.pushes();
  ASSERT_EQ(pushes.size(), grads.size());
  bool some_clipped = false, some_between = false;
  for (size_t t = 0; t < grads.size(); ++t) {
    for (size_t k = 0; k < n; ++k) {
      const double d = expected[t][k];
      EXPECT_NEAR(pushes[t].payload[0][k], d, 1e-6 + 1e-5 * std::fabs(d))
          << "window " << t << ", element " << k;
      const double pi = d / (-lr * grads[t][k] / samples);
      some_clipped |= pi < 1e-9 || pi > 5.0 - 1e-9;
      some_between |= pi > 0.01 && pi < 4.99;
    }
  }
  // The windows reach both the clip and the interior of pi's range.
  EXPECT_TRUE(some_clipped);
  EXPECT_TRUE(some_between);
  for (size_t k = 0; k < n; ++k) {
    EXPECT_NEAR(master.weights()[0][k], c[k], 1e-5) << k;
  }
}

// ---------------------------------------------------------------------------
// easgd: the rank's elastic move.

TEST(ElasticExchangeTest, RankMovesTowardTheCentreAsItWas) {
  const double alpha = 0.25;
  v1::JobSpec spec = SpecFor("easgd");
  spec.mutable_easgd()->set_alpha(alpha);
  const std::vector<float> x = {1.0f, 2.0f, -3.0f};
  const std::vector<float> c = {0.0f, 4.0f, -2.5f};

  FakeGroup group(1);
  FakeMaster master({kMasterLearningRate, static_cast<float>(alpha)});
  master.SetWeights({c});
  ExchangeContext context(group.rank(0), master, "job-1", "group-1", nullptr);
  torch::Tensor p = torch::tensor(x).requires_grad_();
  AttachParameters(context, {p}, {"p"}, 1);
  auto exchange = MakeExchange(spec, context);
  ASSERT_TRUE(exchange.ok());
  ASSERT_TRUE((*exchange)->Start().ok());
  ASSERT_TRUE((*exchange)->EndWindow(0).ok());

  const std::vector<FakeMaster::Push> pushes = master.pushes();
  ASSERT_EQ(pushes.size(), 1u);
  EXPECT_EQ(pushes[0].header.kind(), v1::UPDATE_KIND_ELASTIC);
  for (size_t k = 0; k < x.size(); ++k) {
    const double diff = static_cast<double>(x[k]) - c[k];
    EXPECT_FLOAT_EQ(pushes[0].payload[0][k], x[k]) << k;  // the rank's weights
    EXPECT_NEAR(p.data_ptr<float>()[k], x[k] - alpha * diff, 1e-6) << k;
    EXPECT_NEAR(master.weights()[0][k], c[k] + alpha * diff, 1e-6) << k;
  }
}

// ---------------------------------------------------------------------------
// Buffers (BatchNorm's running statistics): every update carries their
// values, whatever the algorithm; sync carries the mean over the ranks.

TEST(BufferExchangeTest, UpdatesCarryBufferValues) {
  for (const std::string algorithm : {"downpour", "sync", "easgd", "gem"}) {
    SCOPED_TRACE(algorithm);
    const int ranks = algorithm == "sync" ? 2 : 1;
    FakeGroup group(ranks);
    FakeMaster master(MasterRules());
    master.SetWeights({{0.5f, -0.5f}, {0.0f, 1.0f}});
    group.Run([&](Collectives& rank) {
      ExchangeContext context(rank, master, "job-1", "group-1", nullptr);
      torch::Tensor p = torch::tensor(std::vector<float>{0.5f, -0.5f}).requires_grad_();
      // Rank r's running mean: (r + 1) * (2, 3).
      const float r = static_cast<float>(rank.rank() + 1);
      torch::Tensor buffer = torch::tensor(std::vector<float>{2 * r, 3 * r});
      AttachParameters(context, {p, buffer}, {"p", "bn.running_mean"}, 1);
      EXPECT_FALSE(context.layout.tensors(0).buffer());
      EXPECT_TRUE(context.layout.tensors(1).buffer());
      auto exchange = MakeExchange(SpecFor(algorithm), context);
      ASSERT_TRUE(exchange.ok());
      ASSERT_TRUE((*exchange)->Start().ok());
      p.mutable_grad() = torch::tensor(std::vector<float>{4.0f, 8.0f});
      (*exchange)->AfterBatch(4);
      ASSERT_TRUE((*exchange)->EndWindow(4).ok());
    });
    const std::vector<FakeMaster::Push> pushes = master.pushes();
    ASSERT_EQ(pushes.size(), 1u);
    // One rank: its own values; sync over 2 ranks: the mean, (3, 4.5).
    const float scale = ranks == 1 ? 1.0f : 1.5f;
    EXPECT_FLOAT_EQ(pushes[0].payload[1][0], 2 * scale);
    EXPECT_FLOAT_EQ(pushes[0].payload[1][1], 3 * scale);
    if (algorithm == "downpour") {
      // The parameter's part is still the mean gradient.
      EXPECT_FLOAT_EQ(pushes[0].payload[0][0], 1.0f);
      EXPECT_FLOAT_EQ(pushes[0].payload[0][1], 2.0f);
    }
  }
}

// ---------------------------------------------------------------------------
// The master's rejections, by reason.

TEST(PushUpdateTest, StaleRejectionPullsTheNewestWeights) {
  FakeGroup group(1);
  FakeMaster master(MasterRules());
  master.SetWeights(AsTensors(kStart));
  RankRig rig(group.rank(0), master, {1, 1, 1, 1, 1, 1, 1, 1});
  auto exchange = MakeExchange(SpecFor("downpour"), rig.context());
  master.FailNextPush(WithReason(absl::AbortedError("too old"),
                                 v1::ERROR_REASON_STALE_UPDATE));
  rig.Backward(0, 2);
  ASSERT_TRUE((*exchange)->EndWindow(2).ok());
  EXPECT_EQ(rig.context().stale_dropped, 1u);
  EXPECT_EQ(master.pulls(), 1);
  ExpectNear(rig.Weights(), ToParams(kStart), "rank");  // the master's, unchanged
}

TEST(PushUpdateTest, GroupUnknownDropsTheUpdate) {
  FakeGroup group(1);
  FakeMaster master(MasterRules());
  master.SetWeights(AsTensors(kStart));
  RankRig rig(group.rank(0), master, kStart);
  auto exchange = MakeExchange(SpecFor("downpour"), rig.context());
  master.FailNextPush(GroupUnknownError("unknown group"));
  rig.Backward(0, 2);
  EXPECT_TRUE((*exchange)->EndWindow(2).ok());
  EXPECT_EQ(rig.context().stale_dropped, 0u);
  EXPECT_EQ(master.pulls(), 0);
}

TEST(PushUpdateTest, OtherErrorsAreReturned) {
  FakeGroup group(1);
  FakeMaster master(MasterRules());
  master.SetWeights(AsTensors(kStart));
  RankRig rig(group.rank(0), master, kStart);
  auto exchange = MakeExchange(SpecFor("gem"), rig.context());
  ASSERT_TRUE((*exchange)->Start().ok());
  master.FailNextPush(InvalidRequestError("bad layout"));
  rig.Backward(0, 2);
  const absl::Status pushed = (*exchange)->EndWindow(2);
  EXPECT_EQ(pushed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(pushed), v1::ERROR_REASON_INVALID_REQUEST);
}

// ---------------------------------------------------------------------------
// downpour with updates in flight.

v1::JobSpec InFlightSpec(int in_flight) {
  v1::JobSpec spec = SpecFor("downpour");
  spec.mutable_exchange()->set_updates_in_flight(in_flight);
  return spec;
}

// With 2 in flight the rank does not wait for its push: the next window is
// computed on the weights it has, pushed while the first is still out, and
// then the first one's reply is taken; Flush takes the last. Checked against
// SGD in doubles, with the master's gate holding and releasing the pushes.
TEST(InFlightTest, PushesOverlapAndEveryReplyIsTakenInOrder) {
  FakeGroup group(1);
  FakeMaster master(MasterRules());
  master.SetWeights(AsTensors(kStart));
  RankRig rig(group.rank(0), master, kStart);
  auto exchange = MakeExchange(InFlightSpec(2), rig.context());
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  master.HoldPushes();

  rig.Backward(0, 2);
  ASSERT_TRUE((*exchange)->EndWindow(2).ok());  // returns with its push held
  master.AwaitPushesWaiting(1);
  ExpectNear(rig.Weights(), ToParams(kStart), "rank, first push out");

  // The second window, also on the starting weights: its push goes out
  // while the first is still held, then it waits for the first.
  rig.Backward(2, 5);
  absl::Status second;
  std::thread window([&] { second = (*exchange)->EndWindow(3); });
  master.AwaitPushesWaiting(2);  // both out at once
  master.LetPushesThrough(1);
  window.join();
  ASSERT_TRUE(second.ok()) << second;
  const Params start = ToParams(kStart);
  const Params g1 = Gradient(start, 0, 2), g2 = Gradient(start, 2, 5);
  Params after_first = start;
  for (int k = 0; k < kParams; ++k) after_first[k] -= kMasterLearningRate * g1[k] / 2;
  ExpectNear(rig.Weights(), after_first, "rank, first reply taken");
  EXPECT_EQ(rig.context().version, 1u);
  EXPECT_EQ(master.pushes_waiting(), 1);

  master.LetPushesThrough(1);
  ASSERT_TRUE((*exchange)->Flush().ok());
  Params after_second = after_first;
  for (int k = 0; k < kParams; ++k) after_second[k] -= kMasterLearningRate * g2[k] / 3;
  ExpectNear(rig.Weights(), after_second, "rank, after Flush");
  ExpectNear(Flat(master.weights()), after_second, "master");
  EXPECT_EQ(rig.context().version, 2u);
  const std::vector<FakeMaster::Push> pushes = master.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  for (const FakeMaster::Push& push : pushes) {
    EXPECT_EQ(push.header.gradient().version(), 0u);  // both on the start
  }
  EXPECT_TRUE((*exchange)->Flush().ok());  // nothing left: no-op
}

// Three windows with 2 in flight: window k is computed on the weights of
// push k - 2 (the start for the first two), and after Flush the ranks hold
// the master's weights. Checked against that recursion in doubles; for
// sync, two ranks share each window's samples and end identical.
class InFlightReferenceTest : public testing::TestWithParam<std::string> {};

TEST_P(InFlightReferenceTest, WindowsUseTheWeightsOfTwoPushesBefore) {
  const std::string algorithm = GetParam();
  const int ranks = algorithm == "sync" ? 2 : 1;
  constexpr int kWindowsRun = 3;
  // Rank r of window k trains samples [10k + 3r, 10k + 3r + 3) (sync) or
  // the window's whole [10k, 10k + 5) (downpour, one rank).
  auto share = [&](int k, int r) -> std::pair<int, int> {
    if (ranks == 1) return {10 * k, 10 * k + 5};
    return {10 * k + 3 * r, 10 * k + 3 * r + 3};
  };
  FakeGroup group(ranks);
  FakeMaster master(MasterRules());
  master.SetWeights(AsTensors(kStart));
  std::vector<std::vector<float>> after(ranks);
  std::vector<absl::Status> outcome(ranks);
  group.Run([&](Collectives& rank) {
    RankRig rig(rank, master, kStart);
    auto exchange = MakeExchange(InFlightSpec(2), rig.context());
    if (algorithm == "sync") {
      v1::JobSpec spec = InFlightSpec(2);
      spec.set_algorithm("sync");
      exchange = MakeExchange(spec, rig.context());
    }
    if (!exchange.ok()) {
      outcome[rank.rank()] = exchange.status();
      return;
    }
    for (int k = 0; k < kWindowsRun && outcome[rank.rank()].ok(); ++k) {
      const auto [begin, end] = share(k, rank.rank());
      rig.Backward(begin, end);
      outcome[rank.rank()] = (*exchange)->EndWindow(end - begin);
      // Pushes sent together may reach the master in either order; here
      // each arrives before the next is sent, so the reference is exact.
      while (rank.rank() == 0 && master.pushes().size() < static_cast<size_t>(k + 1)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (outcome[rank.rank()].ok()) outcome[rank.rank()] = (*exchange)->Flush();
    after[rank.rank()] = rig.Weights();
  });
  for (const absl::Status& status : outcome) ASSERT_TRUE(status.ok()) << status;

  // c[k]: the master after push k (c[0] the start); window k (from 1) is
  // computed on c[max(k - 2, 0)].
  std::vector<Params> c = {ToParams(kStart)};
  for (int k = 1; k <= kWindowsRun; ++k) {
    const Params& at = c[std::max(k - 2, 0)];
    int begin = share(k - 1, 0).first, end = share(k - 1, ranks - 1).second;
    const Params g = Gradient(at, begin, end);
    Params next = c.back();
    for (int p = 0; p < kParams; ++p) next[p] -= kMasterLearningRate * g[p] / (end - begin);
    c.push_back(next);
  }
  ExpectNear(Flat(master.weights()), c.back(), "master");
  for (int r = 0; r < ranks; ++r) ExpectNear(after[r], c.back(), "rank " + std::to_string(r));
  const std::vector<FakeMaster::Push> pushes = master.pushes();
  ASSERT_EQ(pushes.size(), static_cast<size_t>(kWindowsRun));
  const std::vector<uint64_t> bases = {0, 0, 1};
  for (int k = 0; k < kWindowsRun; ++k) {
    EXPECT_EQ(pushes[k].header.rank(), 0);
    EXPECT_EQ(pushes[k].header.gradient().version(), bases[k]) << "push " << k + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(DownpourAndSync, InFlightReferenceTest,
                         testing::Values("downpour", "sync"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// A push that fails while the rank goes on is reported by the next wait
// for it: here Flush.
TEST(InFlightTest, AFailedPushInFlightIsReturnedByFlush) {
  FakeGroup group(1);
  FakeMaster master(MasterRules());
  master.SetWeights(AsTensors(kStart));
  RankRig rig(group.rank(0), master, kStart);
  auto exchange = MakeExchange(InFlightSpec(3), rig.context());
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  master.FailNextPush(InvalidRequestError("bad layout"));
  rig.Backward(0, 2);
  ASSERT_TRUE((*exchange)->EndWindow(2).ok());
  const absl::Status flushed = (*exchange)->Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kInvalidArgument) << flushed;
  EXPECT_EQ(ReasonOf(flushed), v1::ERROR_REASON_INVALID_REQUEST);
}

}  // namespace
}  // namespace mpilearn::worker
