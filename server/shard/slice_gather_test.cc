// The lead's join of a sharded job's slices: the slices a group's
// ShardedConnection cuts (SliceHeader, SliceViews) come back as the very
// model they were cut from, bit for bit; slices that do not make a whole
// model, strangers' slices and late ones are refused; a gather that a
// shard does not answer ends naming it.
#include "server/shard/slice_gather.h"

#include <numeric>
#include <thread>

#include "common/shard/placement.h"
#include "common/shard/sharded_connection.h"
#include "gtest/gtest.h"

namespace mpilearn::server {
namespace {

const std::vector<std::string> kAddresses = {"shard0:1", "shard1:1"};

// A layout of three tensors (one a buffer), its values 0, 1, 2, ... and its
// placement on two shards with the weight matrix split in ranges.
class SliceGatherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<std::pair<std::string, std::vector<int64_t>>> layout = {
        {"fc.weight", {3, 4}}, {"fc.bias", {4}}, {"bn.running_mean", {2}}};
    std::vector<int64_t> sizes;
    for (const auto& [name, shape] : layout) {
      v1::TensorInfo* info = whole_.add_tensors();
      info->set_name(name);
      info->set_dtype(v1::DTYPE_FLOAT32);
      for (int64_t d : shape) info->add_shape(d);
      info->set_buffer(name == "bn.running_mean");
      const int64_t size = std::accumulate(shape.begin(), shape.end(), int64_t{1},
                                           std::multiplies<int64_t>());
      sizes.push_back(size);
      values_.emplace_back(static_cast<size_t>(size));
    }
    float next = 0.5f;
    for (std::vector<float>& v : values_) {
      for (float& x : v) x = next++;
    }
    whole_.add_input_shape(784);
    whole_.set_outputs(10);
    placement_ = shard::PlaceTensors(sizes, 2, /*split_elements=*/5).value();
    ASSERT_GT(placement_.shards[0].size(), 1u);
  }

  // Shard `s`'s slice at `version`, as it would send it.
  ShardSliceWeights Slice(int s, uint64_t version) {
    ShardSliceWeights slice;
    slice.shard = s;
    slice.address = kAddresses[static_cast<size_t>(s)];
    slice.header = shard::SliceHeader(whole_, placement_, s);
    slice.header.set_version(version);
    std::vector<absl::Span<float>> tensors;
    for (std::vector<float>& v : values_) tensors.push_back(absl::MakeSpan(v));
    const auto views = shard::SliceViews(placement_, tensors).value();
    for (const absl::Span<float>& view : views[static_cast<size_t>(s)]) {
      slice.values.emplace_back(view.begin(), view.end());
    }
    return slice;
  }

  v1::TensorSetHeader whole_;
  std::vector<std::vector<float>> values_;
  shard::Placement placement_;
};

TEST_F(SliceGatherTest, TheSlicesJoinIntoTheModelTheyWereCutFrom) {
  absl::StatusOr<WeightsSnapshot> joined = JoinSlices({Slice(1, 7), Slice(0, 5)});
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_EQ(joined->header.tensors_size(), 3);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(joined->header.tensors(t).name(), whole_.tensors(t).name());
    EXPECT_EQ(joined->header.tensors(t).shape().size(), whole_.tensors(t).shape().size());
    EXPECT_TRUE(std::equal(joined->header.tensors(t).shape().begin(),
                           joined->header.tensors(t).shape().end(),
                           whole_.tensors(t).shape().begin()));
    EXPECT_EQ(joined->header.tensors(t).buffer(), whole_.tensors(t).buffer());
    EXPECT_FALSE(joined->header.tensors(t).has_slice_of());
    EXPECT_EQ(joined->values[static_cast<size_t>(t)], values_[static_cast<size_t>(t)]);
  }
  EXPECT_EQ(joined->header.version(), 12u);  // the sum, as groups count it
  EXPECT_EQ(joined->header.outputs(), 10);
  ASSERT_EQ(joined->header.input_shape_size(), 1);
}

TEST_F(SliceGatherTest, SlicesThatDoNotMakeTheWholeModelAreRefused) {
  // A gap: one shard's slice alone.
  EXPECT_EQ(JoinSlices({Slice(0, 1)}).status().code(), absl::StatusCode::kInvalidArgument);
  // An overlap: shard 0's slice twice.
  const absl::Status twice = JoinSlices({Slice(0, 1), Slice(0, 1), Slice(1, 1)}).status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument) << twice;
  // A whole tensor, not a slice.
  ShardSliceWeights plain = Slice(1, 1);
  plain.header.mutable_tensors(0)->clear_slice_of();
  const absl::Status not_slice = JoinSlices({Slice(0, 1), plain}).status();
  EXPECT_NE(not_slice.message().find("not a slice"), std::string::npos) << not_slice;
  // Two slices disagreeing on the whole tensor's shape.
  ShardSliceWeights reshaped = Slice(1, 1);
  for (v1::TensorInfo& info : *reshaped.header.mutable_tensors()) {
    if (info.slice_of().index() == 0) info.mutable_slice_of()->set_shape(0, 6);
  }
  EXPECT_EQ(JoinSlices({Slice(0, 1), reshaped}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A shape far larger than what was sent is refused before it is sized.
  ShardSliceWeights huge = Slice(1, 1);
  for (v1::TensorInfo& info : *huge.header.mutable_tensors()) {
    info.mutable_slice_of()->set_shape(0, int64_t{1} << 40);
  }
  ShardSliceWeights huge0 = Slice(0, 1);
  for (v1::TensorInfo& info : *huge0.header.mutable_tensors()) {
    info.mutable_slice_of()->set_shape(0, int64_t{1} << 40);
  }
  EXPECT_EQ(JoinSlices({huge0, huge}).status().code(), absl::StatusCode::kInvalidArgument);
  // A tensor of the layout in no slice, though a later one is.
  ShardSliceWeights renumbered0 = Slice(0, 1);
  ShardSliceWeights renumbered1 = Slice(1, 1);
  for (ShardSliceWeights* slice : {&renumbered0, &renumbered1}) {
    for (v1::TensorInfo& info : *slice->header.mutable_tensors()) {
      if (info.slice_of().index() == 2) info.mutable_slice_of()->set_index(3);
    }
  }
  const absl::Status gap = JoinSlices({renumbered0, renumbered1}).status();
  EXPECT_NE(gap.message().find("tensor 2 is in no slice"), std::string::npos) << gap;
  // Values that do not fill the range.
  ShardSliceWeights short_values = Slice(1, 1);
  short_values.values[0].pop_back();
  EXPECT_EQ(JoinSlices({Slice(0, 1), short_values}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SliceGatherTest, AGatherCollectsEveryShardsSliceOnce) {
  SliceGather gather;
  SliceGather::Ticket ticket = gather.Begin("job-1", kAddresses);
  EXPECT_EQ(gather.Begin("job-1", kAddresses).request(), ticket.request());  // joins the gather under way
  // Strangers and repeats are refused; the gather goes on.
  ShardSliceWeights stranger = Slice(1, 3);
  stranger.address = "elsewhere:1";
  EXPECT_EQ(gather.Deliver("job-1", ticket.request(), stranger).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gather.Deliver("job-1", ticket.request() + 1, Slice(1, 3)).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(gather.Deliver("job-1", ticket.request(), Slice(1, 3)).ok());
  EXPECT_EQ(gather.Deliver("job-1", ticket.request(), Slice(1, 3)).code(),
            absl::StatusCode::kInvalidArgument);
  // Two waiters; the last slice arrives from another thread.
  absl::StatusOr<SliceGather::Gathered> second;
  std::thread waiter([&] { second = gather.Await(ticket, absl::Seconds(30)); });
  std::thread shard([&] { ASSERT_TRUE(gather.Deliver("job-1", ticket.request(), Slice(0, 2)).ok()); });
  absl::StatusOr<SliceGather::Gathered> first = gather.Await(ticket, absl::Seconds(30));
  shard.join();
  waiter.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->weights, second->weights);
  EXPECT_EQ(first->oldest_slice, 2u);
  EXPECT_EQ(first->newest_slice, 3u);
  EXPECT_EQ(first->weights->values, values_);
  // The next gather is a new request; a late slice of the old one is refused.
  EXPECT_GT(gather.Begin("job-1", kAddresses).request(), ticket.request());
  EXPECT_EQ(gather.Deliver("job-1", ticket.request(), Slice(0, 2)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SliceGatherTest, AGatherEndsNamingTheShardThatDidNotAnswer) {
  SliceGather gather;
  SliceGather::Ticket ticket = gather.Begin("job-1", kAddresses);
  ASSERT_TRUE(gather.Deliver("job-1", ticket.request(), Slice(0, 1)).ok());
  const absl::Status late = gather.Await(ticket, absl::Milliseconds(10)).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable) << late;
  EXPECT_NE(late.message().find("1 (shard1:1)"), std::string::npos) << late;
  EXPECT_EQ(late.message().find("0 (shard0:1)"), std::string::npos) << late;
  EXPECT_EQ(gather.Deliver("job-1", ticket.request(), Slice(1, 1)).code(),
            absl::StatusCode::kFailedPrecondition);
  // A shard's error ends the gather at once, with its words.
  ticket = gather.Begin("job-1", kAddresses);
  ShardSliceWeights none;
  none.shard = 1;
  none.address = kAddresses[1];
  ASSERT_TRUE(gather.Deliver("job-1", ticket.request(), none, "no weights yet").ok());
  const absl::Status refused = gather.Await(ticket, absl::Seconds(30)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("no weights yet"), std::string::npos) << refused;
  // After Close every gather fails at once.
  gather.Close();
  ticket = gather.Begin("job-2", kAddresses);
  EXPECT_EQ(gather.Await(ticket, absl::Seconds(30)).status().code(),
            absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace mpilearn::server
