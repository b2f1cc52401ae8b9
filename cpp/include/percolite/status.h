// percolite/status.h: the error model of the core.
//
// Thread safety: Status and Error are plain values; copy them freely.
//
// Inside the core, failures are reported by throwing percolite::Error on the
// thread that called the API. Work done on another thread (the group-commit
// writer, worker threads) never lets an exception cross threads: it records a
// Status that travels back to the thread that asked, which then throws. The
// Python bindings translate each ErrorCode to one Python exception class with
// a single table (cpp/bindings/errors.cc):
//
//   kConflict        -> percolite.CommitConflict
//   kClosed          -> percolite.ClosedError
//   kCorruption      -> percolite.CorruptionError
//   kStorage         -> percolite.StorageError
//   kCallback        -> percolite.CallbackError
//   kSinkUnavailable -> percolite.CallbackError
//   kSinkRefused     -> percolite.CallbackError
//   kInvalidArgument -> ValueError
//   kWrongState      -> percolite.Error (e.g. a handle used in a forked child)
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace percolite {

enum class ErrorCode {
  kOk = 0,
  kConflict,
  kClosed,
  kCorruption,
  kStorage,
  kCallback,
  kInvalidArgument,
  kWrongState,
  // An exporter's sink is down (the exporter raised a transient error, or
  // failed for every part of a split batch): not the fault of any key.
  // A queue run that fails so is retried whole, with capped backoff, for as
  // long as it takes; it never counts toward max_attempts and never parks
  // (failures.h, export_queue.h "When a sink fails").
  kSinkUnavailable,
  // An exporter's sink refuses this store's entries for good (it belongs to
  // another store, or the exporter says the failure is permanent): not the
  // fault of any key either. The queue's bucket is blocked at once, its
  // entries kept, until the cause is dealt with (failures.h, "Outages").
  kSinkRefused,
};

// The outcome of an operation performed on another thread.
class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Make(ErrorCode code, std::string message) {
    return Status(code, std::move(message));
  }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Throws percolite::Error when this status is not ok.
  void ThrowIfError() const;

 private:
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// The one exception type the core throws. `what()` names the operation and the cause.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }
  Status ToStatus() const { return Status::Make(code_, what()); }

 private:
  ErrorCode code_;
};

inline void Status::ThrowIfError() const {
  if (!ok()) throw Error(code_, message_);
}

}  // namespace percolite
