#include "handle_state.h"

#include <utility>

#include "fork_guard.h"

namespace percolite {

HandleState::HandleState(std::string forked, std::string closed)
    : fork_generation_((InstallForkGeneration(), ForkGeneration())),
      forked_(std::move(forked)),
      closed_message_(std::move(closed)) {}

bool HandleState::ForkedAway() const { return fork_generation_ != ForkGeneration(); }

void HandleState::Check() const {
  if (ForkedAway()) throw Error(ErrorCode::kWrongState, forked_);
  if (closed_.load()) throw Error(ErrorCode::kClosed, closed_message_);
  if (failed_.load()) {
    MutexLock lock(&mu_);
    throw Error(failure_code_, failure_);
  }
}

bool HandleState::Fail(ErrorCode code, const std::string& message) {
  MutexLock lock(&mu_);
  if (failed_.load()) return false;
  failure_ = message;
  failure_code_ = code;
  failed_.store(true);
  return true;
}

std::string HandleState::failure() const {
  MutexLock lock(&mu_);
  return failure_;
}

}  // namespace percolite
