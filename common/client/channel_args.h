// gRPC channel settings for MPI Learn's bulk tensor streams, shared by the
// master's server and every client, so both ends of a connection agree.
//
// gRPC's HTTP/2 defaults suit small messages: 16 KiB frames and a 64 KiB
// initial flow-control window that the BDP probe grows only over several
// round trips. A push or pull moves megabytes at once, so a stream starts
// with a window that holds a whole 1 MiB chunk several times over, and
// frames of up to 1 MiB (fewer frame headers and writer wake-ups). Memory
// stays bounded: the window only lets a sender run ahead of a reader that
// is draining it anyway.
#ifndef MPILEARN_COMMON_CLIENT_CHANNEL_ARGS_H_
#define MPILEARN_COMMON_CLIENT_CHANNEL_ARGS_H_

#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"

namespace mpilearn {

inline constexpr int kStreamWindowBytes = 8 << 20;
inline constexpr int kMaxFrameBytes = 1 << 20;

inline void SetBulkTransferArgs(grpc::ChannelArguments* args) {
  args->SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  args->SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
}

inline void SetBulkTransferArgs(grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                              kStreamWindowBytes);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
}

}  // namespace mpilearn

#endif  // MPILEARN_COMMON_CLIENT_CHANNEL_ARGS_H_
