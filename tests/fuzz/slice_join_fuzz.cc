// Fuzz target: a lead joining its shards' slices into a job's whole model
// (server/shard/slice_gather JoinSlices), the slices' headers as shards send
// them (ReportSlice). An input is a sequence of slices, each a 2-byte
// little-endian length and that many bytes of a TensorSetHeader (protobuf);
// each slice tensor's values are filled with the element positions its
// name claims (NAME[BEGIN:END] holds BEGIN, BEGIN+1, ...). Properties:
//   - no set of slices crashes the join, or takes memory beyond what the
//     slices hold;
//   - a join that succeeds put every element where its slice said: element
//     j of every joined tensor holds j.
#include <cstdint>
#include <string>
#include <vector>

#include "common/shard/placement.h"
#include "common/shard/sharded_connection.h"
#include "common/tensor_codec.h"
#include "proto/mpilearn.pb.h"
#include "server/shard/slice_gather.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

namespace v1 = mpilearn::v1;
using mpilearn::server::ShardSliceWeights;

// Slices whose values would exceed this are not filled (the lead bounds a
// slice's bytes by --max_model_bytes before it is sized).
constexpr int64_t kMaxElements = int64_t{1} << 20;

}  // namespace

namespace mpilearn::fuzz {

std::vector<std::string> Seeds() {
  // A layout of three tensors on one, two and three shards, the largest
  // cut into ranges.
  v1::TensorSetHeader whole;
  const std::vector<std::vector<int64_t>> shapes = {{6, 5}, {5}, {3}};
  std::vector<int64_t> sizes;
  for (size_t t = 0; t < shapes.size(); ++t) {
    v1::TensorInfo* info = whole.add_tensors();
    info->set_name(t == 0 ? "fc.weight" : t == 1 ? "fc.bias" : "bn.running_mean");
    info->set_dtype(v1::DTYPE_FLOAT32);
    info->set_buffer(t == 2);
    int64_t size = 1;
    for (int64_t d : shapes[t]) {
      info->add_shape(d);
      size *= d;
    }
    sizes.push_back(size);
  }
  std::vector<std::string> seeds;
  for (int shards = 1; shards <= 3; ++shards) {
    const shard::Placement placement = shard::PlaceTensors(sizes, shards, 8).value();
    std::string input;
    for (int s = 0; s < shards; ++s) {
      input += LengthPrefixed(shard::SliceHeader(whole, placement, s).SerializeAsString());
    }
    seeds.push_back(input);
  }
  return seeds;
}

}  // namespace mpilearn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mpilearn::fuzz::QuietProtobufLogs();
  std::vector<ShardSliceWeights> slices;
  int64_t elements = 0;
  size_t at = 0;
  while (at + 2 <= size && slices.size() < 16) {
    const size_t length = data[at] | (size_t{data[at + 1]} << 8);
    at += 2;
    if (length > size - at) return 0;
    ShardSliceWeights slice;
    slice.shard = static_cast<int>(slices.size());
    if (!slice.header.ParseFromArray(data + at, static_cast<int>(length))) return 0;
    at += length;
    absl::StatusOr<std::vector<int64_t>> counts =
        mpilearn::TensorSetAssembler::ElementCounts(slice.header);
    if (!counts.ok()) return 0;
    for (size_t t = 0; t < counts->size(); ++t) {
      elements += (*counts)[t];
      if ((*counts)[t] < 0 || elements > kMaxElements) return 0;
      std::string name;
      int64_t begin = 0;
      int64_t end = 0;
      if (!mpilearn::shard::ParseSliceName(slice.header.tensors(static_cast<int>(t)).name(),
                                           &name, &begin, &end)) {
        begin = 0;
      }
      std::vector<float> values(static_cast<size_t>((*counts)[t]));
      for (size_t i = 0; i < values.size(); ++i) {
        values[i] = static_cast<float>((begin + static_cast<int64_t>(i)) % (1 << 24));
      }
      slice.values.push_back(std::move(values));
    }
    slices.push_back(std::move(slice));
  }
  absl::StatusOr<mpilearn::server::WeightsSnapshot> joined =
      mpilearn::server::JoinSlices(std::move(slices));
  if (!joined.ok()) return 0;
  mpilearn::fuzz::Accepted();
  for (const std::vector<float>& tensor : joined->values) {
    for (size_t j = 0; j < tensor.size(); ++j) {
      FUZZ_CHECK(tensor[j] == static_cast<float>(static_cast<int64_t>(j) % (1 << 24)),
                 "a joined element is not where its slice put it");
    }
  }
  return 0;
}
