// A group's connection to a sharded job (docs/sharding.md): one gRPC client
// per shard the lead named at registration, wrapped with the lead's client
// in a ShardedConnection that the trainer then uses as its master.
//
//   if (registration.shards().addresses_size() > 0) {
//     MPILEARN_ASSIGN_OR_RETURN(auto sharded,
//         ConnectShards(lead, registration.shards(), client_options, group));
//   }
#ifndef MPILEARN_COMMON_SHARD_CONNECT_SHARDS_H_
#define MPILEARN_COMMON_SHARD_CONNECT_SHARDS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/client/master_client.h"
#include "common/client/master_connection.h"
#include "common/shard/sharded_connection.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::shard {

// Connects to every shard of `placement` with `options` (the same TLS, token
// and retries as the lead's client). UNAVAILABLE naming the shard that does
// not answer within options.connect_timeout; INVALID_ARGUMENT for a
// placement without shards or with more than kMaxShards.
absl::StatusOr<std::unique_ptr<ShardedConnection>> ConnectShards(
    MasterConnection& lead, const v1::ShardPlacement& placement,
    const MasterClient::Options& options, ShardedConnection::GroupInfo group);

}  // namespace mpilearn::shard

#endif  // MPILEARN_COMMON_SHARD_CONNECT_SHARDS_H_
