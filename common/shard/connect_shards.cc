#include "common/shard/connect_shards.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/shard/placement.h"

namespace mpilearn::shard {

absl::StatusOr<std::unique_ptr<ShardedConnection>> ConnectShards(
    MasterConnection& lead, const v1::ShardPlacement& placement,
    const MasterClient::Options& options, ShardedConnection::GroupInfo group) {
  const int count = placement.addresses_size();
  if (count < 1 || count > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sharded job names ", count, " shards; 1 to ", kMaxShards, " expected"));
  }
  std::vector<std::unique_ptr<MasterConnection>> owned;
  std::vector<MasterConnection*> shards;
  for (int s = 0; s < count; ++s) {
    const std::string& address = placement.addresses(s);
    absl::StatusOr<std::unique_ptr<MasterClient>> client = MasterClient::Connect(address, options);
    if (!client.ok()) {
      return absl::Status(client.status().code(),
                          absl::StrCat("parameter shard ", s, " of the job: ",
                                       client.status().message()));
    }
    shards.push_back(client->get());
    owned.push_back(*std::move(client));
  }
  return std::make_unique<ShardedConnection>(lead, std::move(shards),
                                             placement.split_elements(), std::move(group),
                                             std::move(owned));
}

}  // namespace mpilearn::shard
