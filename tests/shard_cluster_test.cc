// A sharded parameter service across hosts (docs/sharding.md): network
// namespaces as hosts (NetnsCluster), a lead mpilearn-master on host 0, two
// mpilearn-master --shard_of processes on hosts 1 and 2, and a real
// `mpirun` group whose ranks are on hosts 3 and 4; TLS and tokens
// everywhere, the shards reaching the lead with an admin token.
//
// The same sync job (MLP, Fashion-MNIST subset, fixed seed) trains on one
// master and on the lead with two shards: the same accuracy, and the same
// final weights as a PullWeights from each master returns them (the lead
// joins its shards' slices), while a validation pool on host 5 validates
// the snapshots the lead gathers at epoch ends. Then a shard's
// host loses every process mid-training and the shard is started again from
// its state directory: the lead rolls the other shard's slice back to the
// same checkpoint version, and the job completes within a point of the
// undisturbed sharded run. The shards' checkpoints the lead names as its
// restore set (shard_manifest.json) join into one master's checkpoint of
// that version, bit for bit.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_file.h"
#include "common/client/master_client.h"
#include "common/tensor_codec.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"
#include "server/shard/slice_gather.h"
#include "tests/test_process.h"
#include "tools/cluster/netns_cluster.h"

namespace mpilearn::testing {
namespace {

using server::JoinSlices;
using server::ShardSliceWeights;
using server::WeightsSnapshot;
using tools::NetnsCluster;

constexpr int64_t kTrainLimit = 12000;  // 10,000 train + 2,000 validation
constexpr int kEpochs = 2;
constexpr double kMinAccuracy = 0.75;
constexpr int kShards = 2;
constexpr char kAdminToken[] = "shards-admin-token-0123456789";
constexpr char kWorkerToken[] = "shards-worker-token-0123456789";

// Host 0: the master or lead; hosts 1 and 2: the shards; hosts 3 and 4: the
// group's two ranks; host 5: a validation pool.
class ShardClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveFashionMnist()) {
      GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
    }
    absl::StatusOr<std::unique_ptr<NetnsCluster>> cluster = NetnsCluster::Create(6);
    if (!cluster.ok()) {
      GTEST_SKIP() << "no network namespaces on this machine: " << cluster.status();
    }
    cluster_ = *std::move(cluster);
    dir_ = NewTempDir("shard_cluster");
    // One certificate for the lead's and the shards' addresses.
    const absl::Status made = MakeCertificates(
        dir_, absl::StrCat("IP:", cluster_->address(0), ",IP:", cluster_->address(1), ",IP:",
                           cluster_->address(2)));
    ASSERT_TRUE(made.ok()) << made;
    WriteFileOrDie(dir_ + "/tokens.txt", absl::StrCat("admin  test  ", kAdminToken,
                                                      "\nworker hosts ", kWorkerToken, "\n"));
    WriteFileOrDie(dir_ + "/admin.token", absl::StrCat(kAdminToken, "\n"));
    WriteFileOrDie(dir_ + "/worker.token", absl::StrCat(kWorkerToken, "\n"));
  }

  std::vector<std::string> ServerFlags() const {
    return {"--group_timeout_s=10", "--tls_cert=" + dir_ + "/server.pem",
            "--tls_key=" + dir_ + "/server.key", "--tokens_file=" + dir_ + "/tokens.txt"};
  }

  // The master on host 0 (`extra`: a lead's flags), and an admin client.
  void StartMaster(const std::string& name, std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = ServerFlags();
    flags.insert(flags.end(), extra.begin(), extra.end());
    auto master = MasterProcess::StartOn(cluster_->address(0), cluster_->InHost(0, {}),
                                         dir_ + "/" + name, flags);
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = *std::move(master);
    MasterClient::Options options;
    options.security.tls_ca = dir_ + "/ca.pem";
    options.security.token = kAdminToken;
    auto client = MasterClient::Connect(master_->address(), options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // Shard `k` (1 or 2) on host k, syncing with the master on host 0; on
  // `port` when given (a restart keeps its address: the lead placed the
  // job there).
  absl::StatusOr<std::unique_ptr<MasterProcess>> StartShard(int k, int port = 0) {
    std::vector<std::string> flags = ServerFlags();
    flags.insert(flags.end(), {"--shard_of=" + master_->address(),
                               "--lead_tls_ca=" + dir_ + "/ca.pem",
                               "--lead_token_file=" + dir_ + "/admin.token"});
    if (port != 0) flags.push_back(absl::StrCat("--listen=", cluster_->address(k), ":", port));
    return MasterProcess::StartOn(cluster_->address(k), cluster_->InHost(k, {}),
                                  absl::StrCat(dir_, "/shard", k), flags);
  }

  // Submits `spec` and trains it with a group on hosts 3 and 4; with
  // `pool`, a validation pool on host 5 follows the job first (pool_).
  std::unique_ptr<ChildProcess> StartJob(const std::string& name, const v1::JobSpec& spec,
                                         bool pool = false) {
    auto job_id = client_->SubmitJob(spec);
    EXPECT_TRUE(job_id.ok()) << job_id.status();
    if (!job_id.ok()) return nullptr;
    job_id_ = *job_id;
    const std::vector<std::string> flags = {"--threads=1", "--tls_ca=" + dir_ + "/ca.pem",
                                            "--token_file=" + dir_ + "/worker.token"};
    if (pool) {
      std::vector<std::string> pool_flags = flags;
      pool_flags.insert(pool_flags.end(), {"--role=validate", "--jobs=" + job_id_,
                                           "--pool_label=remote", "--exit_when_idle_s=10"});
      auto started = StartWorkers(1, master_->address(), pool_flags,
                                  absl::StrCat(dir_, "/", name, "_pool.log"),
                                  cluster_->MpirunArgs({5}));
      EXPECT_TRUE(started.ok()) << started.status();
      if (!started.ok()) return nullptr;
      pool_ = *std::move(started);
      // One mpirun at a time: the pool subscribes before training starts.
      EXPECT_TRUE(WaitForLog(*pool_, "waiting for snapshots", absl::Seconds(120)))
          << pool_->Log();
    }
    std::vector<std::string> group_flags = flags;
    group_flags.push_back("--job_id=" + job_id_);
    auto workers = StartWorkers(2, master_->address(), group_flags,
                                absl::StrCat(dir_, "/", name, ".log"), cluster_->MpirunArgs({3, 4}));
    EXPECT_TRUE(workers.ok()) << workers.status();
    return workers.ok() ? *std::move(workers) : nullptr;
  }

  // The job's weights as PullWeights serves them to a client without a
  // group (fp32): names, shapes and values.
  struct Weights {
    v1::TensorSetHeader header;
    std::vector<std::vector<float>> values;
  };
  Weights PullWhole() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::PullWeightsRequest request;
    request.set_job_id(job_id_);
    std::unique_ptr<grpc::ClientReaderInterface<v1::WeightsPart>> reader =
        client_->stub().PullWeights(&context, request);
    Weights weights;
    std::optional<TensorSetAssembler> assembler;
    v1::WeightsPart part;
    while (reader->Read(&part)) {
      if (part.has_header()) {
        weights.header = part.header();
        const absl::StatusOr<std::vector<int64_t>> counts =
            TensorSetAssembler::ElementCounts(weights.header);
        EXPECT_TRUE(counts.ok()) << counts.status();
        if (!counts.ok()) break;
        for (const int64_t count : *counts) weights.values.emplace_back(static_cast<size_t>(count));
        std::vector<absl::Span<float>> spans;
        for (std::vector<float>& v : weights.values) spans.push_back(absl::MakeSpan(v));
        assembler.emplace(TensorSetAssembler::Create(weights.header, spans).value());
      } else if (assembler.has_value()) {
        EXPECT_TRUE(assembler->Add(part.chunk()).ok());
      }
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(assembler.has_value() && assembler->Finish().ok());
    return weights;
  }

  // The weights of a checkpoint file.
  static Float32Tensors CheckpointWeights(const std::string& path) {
    absl::StatusOr<v1::JobCheckpointFile> file = ReadCheckpointFile(path);
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return {};
    absl::StatusOr<Float32Tensors> weights = FromTensorSet(file->weights());
    EXPECT_TRUE(weights.ok()) << weights.status();
    return weights.ok() ? *std::move(weights) : Float32Tensors{};
  }

  // The lead's shard_manifest.json of the job, once it names the set the
  // job's status does (the lead writes it within a second or so: a bound,
  // not a schedule).
  v1::ShardManifest ReadManifest() {
    const std::string path = dir_ + "/lead/jobs/" + job_id_ + "/shard_manifest.json";
    v1::ShardManifest manifest;
    for (int i = 0; i < 300; ++i) {
      const uint64_t named = client_->GetJobStatus(job_id_).value().shard_set_version();
      std::string json;
      if (access(path.c_str(), F_OK) == 0) json = ReadFileOrDie(path);
      manifest.Clear();
      if (!json.empty() && google::protobuf::util::JsonStringToMessage(json, &manifest).ok() &&
          manifest.version() == named) {
        return manifest;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    ADD_FAILURE() << "no shard_manifest.json naming the job's restore set: " << path;
    return manifest;
  }

  v1::JobStatus ExpectCompleted(ChildProcess& workers) {
    const std::optional<int> exit_code = workers.Wait(absl::Seconds(300));
    EXPECT_TRUE(exit_code.has_value()) << "workers did not finish in 300 s:\n" << workers.Log();
    EXPECT_EQ(exit_code.value_or(-1), 0) << workers.Log();
    absl::StatusOr<v1::JobStatus> status = client_->GetJobStatus(job_id_);
    EXPECT_TRUE(status.ok()) << status.status();
    if (!status.ok()) return {};
    EXPECT_EQ(status->state(), v1::JOB_STATE_COMPLETED) << status->message();
    EXPECT_GE(status->test_accuracy(), kMinAccuracy) << workers.Log();
    EXPECT_EQ(status->samples_trained(), static_cast<uint64_t>((kTrainLimit - 2000) * kEpochs));
    return *status;
  }

  // The lead and both shards, the lead waiting for them before it places a
  // job.
  void StartLeadAndShards() {
    StartMaster("lead", {absl::StrCat("--min_shards=", kShards)});
    for (int k = 1; k <= kShards; ++k) {
      absl::StatusOr<std::unique_ptr<MasterProcess>> shard = StartShard(k);
      ASSERT_TRUE(shard.ok()) << shard.status();
      shards_.push_back(*std::move(shard));
    }
  }

  // Each shard holds a slice of the job: its status lists both, on hosts 1
  // and 2, their parameters summing to the job's.
  void ExpectOnShards(const v1::JobStatus& status) {
    ASSERT_EQ(status.shards_size(), kShards) << status.ShortDebugString();
    uint64_t parameters = 0;
    for (int k = 0; k < kShards; ++k) {
      EXPECT_EQ(status.shards(k).address(), shards_[k]->address());
      EXPECT_GT(status.shards(k).parameters(), 0u);
      parameters += status.shards(k).parameters();
    }
    EXPECT_EQ(parameters, status.parameters());
  }

  std::unique_ptr<NetnsCluster> cluster_;  // torn down last
  std::string dir_;
  std::unique_ptr<MasterProcess> master_;
  std::vector<std::unique_ptr<MasterProcess>> shards_;
  std::unique_ptr<ChildProcess> pool_;
  std::unique_ptr<MasterClient> client_;
  std::string job_id_;
};

// One master, then a lead with two shards: the same job reaches the same
// accuracy, the same test loss and the same final weights; a validation
// pool validates the sharded job's snapshots.
TEST_F(ShardClusterTest, ShardedJobTrainsAsOneMasterDoes) {
  v1::JobSpec spec = FashionMnistSubset("sync", kTrainLimit, kEpochs);
  // Checkpoints of every 20th version, all kept: the single master's of the
  // restore set's version is there to compare.
  spec.mutable_checkpoint()->set_every_updates(20);
  spec.mutable_checkpoint()->set_keep(100);
  StartMaster("single");
  std::unique_ptr<ChildProcess> workers = StartJob("single", spec);
  ASSERT_NE(workers, nullptr);
  const v1::JobStatus single = ExpectCompleted(*workers);
  EXPECT_EQ(single.shards_size(), 0);
  const Weights single_weights = PullWhole();
  const std::string single_job = job_id_;
  client_.reset();
  master_.reset();

  StartLeadAndShards();
  workers = StartJob("sharded", spec, /*pool=*/true);
  ASSERT_NE(workers, nullptr);
  ExpectCompleted(*workers);
  // The pool ends once idle; its reports are in the job's status then.
  ASSERT_TRUE(pool_->Wait(absl::Seconds(120)).has_value()) << pool_->Log();
  const v1::JobStatus sharded = client_->GetJobStatus(job_id_).value();
  ExpectOnShards(sharded);
  int from_pool = 0;
  for (const v1::ValidationRecord& record : sharded.validations()) {
    if (record.source().find("remote") == std::string::npos) continue;
    ++from_pool;
    // A trained model's (chance is 0.1), from one epoch on.
    EXPECT_GE(record.val_accuracy(), 0.6) << record.ShortDebugString();
  }
  EXPECT_GT(from_pool, 0) << sharded.ShortDebugString() << "\n" << pool_->Log();
  // The lead serves the whole model, joined from the shards' slices: the
  // very weights one master ended on.
  const Weights sharded_weights = PullWhole();
  ASSERT_EQ(sharded_weights.header.tensors_size(), single_weights.header.tensors_size());
  for (int t = 0; t < single_weights.header.tensors_size(); ++t) {
    EXPECT_EQ(sharded_weights.header.tensors(t).name(), single_weights.header.tensors(t).name());
    EXPECT_EQ(sharded_weights.header.tensors(t).shape_size(),
              single_weights.header.tensors(t).shape_size());
  }
  EXPECT_TRUE(sharded_weights.values == single_weights.values)
      << "the lead's joined weights differ from one master's";
  // The lead's last checkpoint of the job, gathered from the shards, left
  // the final weights where a master leaves a job's (weights.pb, which
  // mpilearn-export reads): the same ones. It is written once the job's end
  // reached the lead's gathering thread: a bound, not a schedule.
  const std::string final_path = dir_ + "/lead/jobs/" + job_id_ + "/weights.pb";
  for (int i = 0; i < 300 && access(final_path.c_str(), F_OK) != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  v1::TensorSet final_weights;
  ASSERT_TRUE(final_weights.ParseFromString(ReadFileOrDie(final_path))) << final_path;
  ASSERT_EQ(final_weights.data_size(), static_cast<int>(single_weights.values.size()));
  for (int t = 0; t < final_weights.data_size(); ++t) {
    const std::vector<float>& want = single_weights.values[static_cast<size_t>(t)];
    ASSERT_EQ(final_weights.data(t).size(), want.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(final_weights.data(t).data(), want.data(), final_weights.data(t).size()),
              0)
        << "tensor " << t << " of the lead's weights.pb";
  }
  // The restore set the lead names in shard_manifest.json: each shard's own
  // checkpoint of one version (slice weights and optimizer state), joined,
  // is one master's checkpoint of that version, bit for bit.
  const v1::ShardManifest manifest = ReadManifest();
  ASSERT_GT(manifest.version(), 0u);
  EXPECT_EQ(sharded.shard_set_version(), manifest.version());
  std::vector<ShardSliceWeights> slices;
  for (const v1::ShardManifest::Slice& entry : manifest.slices()) {
    int host = 0;
    for (int k = 0; k < kShards; ++k) {
      if (shards_[k]->address() == entry.address()) host = k + 1;
    }
    ASSERT_NE(host, 0) << entry.ShortDebugString();
    const Float32Tensors slice =
        CheckpointWeights(absl::StrCat(dir_, "/shard", host, "/", entry.checkpoint()));
    ASSERT_EQ(slice.header.version(), manifest.version());
    slices.push_back({entry.shard(), entry.address(), slice.header, slice.values});
  }
  absl::StatusOr<WeightsSnapshot> joined = JoinSlices(std::move(slices));
  ASSERT_TRUE(joined.ok()) << joined.status();
  const Float32Tensors one_master = CheckpointWeights(absl::StrFormat(
      "%s/single/jobs/%s/checkpoints/ckpt-%012d.pb", dir_, single_job, manifest.version()));
  EXPECT_TRUE(joined->values == one_master.values)
      << "the shards' checkpoints of version " << manifest.version()
      << " differ from one master's";
  EXPECT_NEAR(sharded.test_accuracy(), single.test_accuracy(), 0.01);
  // More: one group of one thread per rank trains deterministically, and
  // each shard applies Adam to its slice as one master applies it to the
  // whole, so the sharded run ends on the same weights, bit for bit.
  EXPECT_DOUBLE_EQ(sharded.test_loss(), single.test_loss());
  std::printf("one master: test_accuracy=%.4f test_loss=%.6f; lead + %d shards: "
              "test_accuracy=%.4f test_loss=%.6f, %d pool validations, restore set of "
              "version %llu equal to one master's checkpoint\n",
              single.test_accuracy(), single.test_loss(), kShards, sharded.test_accuracy(),
              sharded.test_loss(), from_pool, static_cast<unsigned long long>(manifest.version()));
}

// A shard's host loses every process mid-training; the shard is started
// again on the same address from its state directory (its slice's last
// checkpoint). The group's pushes wait and retry, the group registers
// again, and the job completes within a point of the undisturbed run.
TEST_F(ShardClusterTest, ShardKilledAndRestartedTheJobCompletes) {
  v1::JobSpec spec = FashionMnistSubset("sync", kTrainLimit, kEpochs);
  // Each slice checkpoints often, so a restarted shard loses few updates.
  spec.mutable_checkpoint()->set_every_updates(5);
  StartLeadAndShards();
  std::unique_ptr<ChildProcess> workers = StartJob("undisturbed", spec);
  ASSERT_NE(workers, nullptr);
  const v1::JobStatus undisturbed = ExpectCompleted(*workers);
  ExpectOnShards(undisturbed);

  workers = StartJob("shard_killed", spec);
  ASSERT_NE(workers, nullptr);
  absl::StatusOr<v1::JobStatus> training = WaitForStatus(
      *client_, job_id_, absl::Seconds(120), [](const v1::JobStatus& s) {
        return s.updates_applied() >= 40 || s.state() == v1::JOB_STATE_COMPLETED;
      });
  ASSERT_TRUE(training.ok()) << training.status();
  ASSERT_NE(training->state(), v1::JOB_STATE_COMPLETED) << "the job ended before the fault";
  const int port = std::stoi(shards_[1]->address().substr(shards_[1]->address().rfind(':') + 1));
  ASSERT_TRUE(cluster_->KillHostProcesses(2).ok());
  const std::optional<int> killed = shards_[1]->process().Wait(absl::Seconds(30));
  ASSERT_TRUE(killed.has_value()) << "shard 2 outlived SIGKILL by 30 s";
  absl::SleepFor(absl::Seconds(2));
  absl::StatusOr<std::unique_ptr<MasterProcess>> restarted = StartShard(2, port);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  shards_[1] = *std::move(restarted);
  const v1::JobStatus recovered = ExpectCompleted(*workers);
  ExpectOnShards(recovered);
  EXPECT_NEAR(recovered.test_accuracy(), undisturbed.test_accuracy(), 0.01);
  EXPECT_NE(workers->Log().find("registering again"), std::string::npos) << workers->Log();
  // The restarted shard's slice came back at its last checkpoint, and the
  // lead rolled the other shard's back to the same version (the newest both
  // hold), so the slices went on from one state of the model.
  EXPECT_NE(master_->process().Log().find("rolling the job's slices back to version"), std::string::npos)
      << master_->process().Log();
  EXPECT_NE(shards_[0]->process().Log().find("rolled back to its checkpoint of version"), std::string::npos)
      << shards_[0]->process().Log();
  std::printf("shard on host 2 killed after %llu updates and restarted: test_accuracy=%.4f "
              "(undisturbed %.4f)\n",
              static_cast<unsigned long long>(training->updates_applied()),
              recovered.test_accuracy(), undisturbed.test_accuracy());
}

// The lead's host loses every process mid-training and the lead is started
// again on its address and state directory: it rebuilds the job's
// placement from its shards' reports (it places nothing before both are
// live, --min_shards), resumes the job's data queue from its own
// checkpoint (the weights gathered from the shards), the group registers
// again, and the job completes on the same two shards.
TEST_F(ShardClusterTest, LeadRestartedFindsItsShardsAgain) {
  StartLeadAndShards();
  v1::JobSpec spec = FashionMnistSubset("sync", kTrainLimit, kEpochs);
  spec.mutable_checkpoint()->set_every_seconds(1);
  std::unique_ptr<ChildProcess> workers = StartJob("lead_killed", spec);
  ASSERT_NE(workers, nullptr);
  // Killed once the lead has a checkpoint of the job.
  absl::StatusOr<v1::JobStatus> training = WaitForStatus(
      *client_, job_id_, absl::Seconds(120), [](const v1::JobStatus& s) {
        return (s.updates_applied() >= 40 && s.checkpoint_version() > 0) ||
               s.state() == v1::JOB_STATE_COMPLETED;
      });
  ASSERT_TRUE(training.ok()) << training.status();
  ASSERT_NE(training->state(), v1::JOB_STATE_COMPLETED) << "the job ended before the fault";
  const std::string address = master_->address();
  ASSERT_TRUE(cluster_->KillHostProcesses(0).ok());
  ASSERT_TRUE(master_->process().Wait(absl::Seconds(30)).has_value())
      << "the lead outlived SIGKILL by 30 s";
  client_.reset();
  StartMaster("lead", {absl::StrCat("--min_shards=", kShards),
                       absl::StrCat("--listen=", address)});
  ASSERT_EQ(master_->address(), address);
  const v1::JobStatus done = ExpectCompleted(*workers);
  ExpectOnShards(done);
  // From the shards' reports, not placed anew.
  EXPECT_NE(master_->process().Log().find("job " + job_id_ + ": placement on 2 shard(s) rebuilt"),
            std::string::npos)
      << master_->process().Log();
  // Its data queue from the lead's checkpoint, not from the first unit.
  EXPECT_NE(master_->process().Log().find("job " + job_id_ + " loaded from checkpoint"),
            std::string::npos)
      << master_->process().Log();
  // The shards' versions went on from where they were: nothing started
  // from fresh weights.
  EXPECT_GT(done.shards(0).version(), training->shards(0).version());
  std::printf("lead killed after %llu updates and restarted: the job completed on the same %d "
              "shards, test_accuracy=%.4f\n",
              static_cast<unsigned long long>(training->updates_applied()), kShards,
              done.test_accuracy());
}

}  // namespace
}  // namespace mpilearn::testing
