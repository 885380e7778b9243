#include "worker/group_heartbeat.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace mpilearn::worker {

v1::LeaveRequest GroupHeartbeat::TerminationLeave(const std::string& job_id,
                                                  const std::string& group_id,
                                                  int signal) {
  v1::LeaveRequest leave;
  leave.set_job_id(job_id);
  leave.set_group_id(group_id);
  leave.set_abandoned(TerminationText(signal));
  return leave;
}

std::string GroupHeartbeat::TerminationText(int signal) {
  return absl::StrCat("rank terminated: signal ", signal,
                      " (another rank of the group probably died)");
}

GroupHeartbeat::GroupHeartbeat(MasterConnection& master, Options options)
    : master_(master), options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
}

GroupHeartbeat::~GroupHeartbeat() { Stop(); }

void GroupHeartbeat::SetGroup(const std::string& job_id,
                              const std::string& group_id) {
  absl::MutexLock lock(&mu_);
  job_id_ = job_id;
  group_id_ = group_id;
  ++generation_;
}

void GroupHeartbeat::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void GroupHeartbeat::Beat(const v1::HeartbeatRequest& request) {
  const absl::StatusOr<v1::JobState> state =
      master_.Heartbeat(request, options_.period);
  if (!state.ok() && !failing_) {
    LOG(WARNING) << "[rank 0] heartbeat of group " << request.group_id()
                 << " failed: " << state.status().message()
                 << " (not fatal; logged once until one succeeds)";
  } else if (state.ok() && failing_) {
    LOG(INFO) << "[rank 0] heartbeats of group " << request.group_id()
              << " reach the master again";
  }
  failing_ = !state.ok();
}

void GroupHeartbeat::Run() {
  uint64_t generation = 0;
  absl::Time next_beat = absl::InfiniteFuture();
  for (;;) {
    v1::HeartbeatRequest request;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.poll);
      stop = stop_;
      request.set_job_id(job_id_);
      request.set_group_id(group_id_);
      if (generation_ != generation) {
        generation = generation_;
        next_beat = options_.period > absl::ZeroDuration()
                        ? absl::Now() + options_.period
                        : absl::InfiniteFuture();
      }
    }
    // A signal wins over Stop: a group terminated while it finishes must
    // still leave and end.
    const int signal = options_.terminate_signal != nullptr
                           ? options_.terminate_signal->load()
                           : 0;
    if (signal != 0) {
      const std::string cause = TerminationText(signal);
      absl::Status left = absl::FailedPreconditionError("no group registered");
      if (!request.group_id().empty()) {
        left = master_
                   .LeaveWithin(TerminationLeave(request.job_id(),
                                                 request.group_id(), signal),
                                options_.leave_timeout)
                   .status();
      }
      std::fprintf(stderr, "[rank 0] mpilearn-worker: %s; %s\n", cause.c_str(),
                   left.ok()
                       ? absl::StrCat("left group ", request.group_id(),
                                      ": the master re-queues its units")
                             .c_str()
                       : absl::StrCat("could not leave (", left.message(),
                                      "): the master declares the group lost "
                                      "when its heartbeats stop")
                             .c_str());
      std::fflush(stderr);
      if (options_.on_terminated) {
        options_.on_terminated(signal);
        return;
      }
      _exit(1);
    }
    if (stop) return;
    const absl::Time now = absl::Now();
    if (!request.group_id().empty() && now >= next_beat) {
      Beat(request);
      next_beat = absl::Now() + options_.period;
    }
  }
}

}  // namespace mpilearn::worker
