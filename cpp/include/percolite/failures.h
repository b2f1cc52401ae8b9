// percolite/failures.h: failed and parked work, recorded in the store.
//
// Thread safety: the functions here take a Transaction (used by one thread)
// or a TransactionSource (any thread); they keep no state of their own.
//
// Contract
// - What went wrong is kept in the store, in percolite's own rows (their
//   names begin with kSystemRowPrefix, a 0x00 byte then "pc:"), written by
//   ordinary transactions: every process (and every backend) reads the same
//   records, and they survive restarts.
// - A work record per notification that failed: the observer's name, the
//   notification's cell, how many runs failed (attempts), the first and last
//   failure times, the last error (type, message, traceback), and whether
//   the work is parked. A run that commits deletes its notification's record
//   in the same commit (the work is done).
// - A failure summary per observer: failed runs, parkings, first and last
//   failure times, the last error and the cell it was on. Summaries outlive
//   the work records (they are history; work records are state).
// - Parking: RecordFailure counts a failed run; when its attempts reach the
//   observer's max_attempts (> 0), the record is marked parked and the same
//   commit consumes the notification as a successful run would (its ack and
//   its removal, notifications.h): parked work is no longer pending, so
//   waiting for the workers ends. A notification of a parked cell set again
//   later is consumed the same way when it comes to run (its run commits
//   with nothing but the trigger) and the work stays parked: parked work
//   runs again only when retried.
// - Keyed work: a queue's processor (queue_rows.h) parks one key of a
//   bucket instead of the bucket's notification. Its record names the
//   bucket's notification cell and the key, and is written by the bucket
//   run itself (ParkKey), in the run's transaction; the run leaves the
//   key's entries queued, and later runs skip them (ParkedKeys) until the
//   key is retried.
// - Outages: a failure whose status is kSinkUnavailable (status.h: a
//   queue's sink is down, not any key at fault) is recorded with `sink`
//   kDown and does not count as an attempt: it never parks the work, and the
//   attempts before it stay as they were. The record shows the outage (since
//   first_failure_unix, the last error) until a run commits and deletes it.
//   A failure whose status is kSinkRefused (the sink refuses this store for
//   good) is recorded with `sink` kRefused and parks the work at once: the
//   bucket is blocked, its entries kept, until it is retried.
// - RetryParked(filter) deletes the matching parked records and sets a weak
//   notification on each of their cells (for keyed work, the bucket's), in
//   one transaction per kRetryChunk records: the work runs again, with a
//   fresh attempt count.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "percolite/encoding.h"
#include "percolite/status.h"
#include "percolite/transaction.h"

namespace percolite {

// Rows percolite keeps for itself begin with these bytes.
inline const std::string kSystemRowPrefix("\0pc:", 4);

// How a failure involved a queue's sink (see Outages above).
enum class SinkFailure : uint8_t {
  kNone = 0,     // not the sink's: an ordinary failed attempt
  kDown = 1,     // the sink is down (kSinkUnavailable)
  kRefused = 2,  // the sink refuses this store for good (kSinkRefused)
};

// An error as reported to a person: its type ("ValueError"), its message,
// and the full traceback (or the text of a core error).
struct ErrorDetail {
  std::string type;
  std::string message;
  std::string traceback;
};

// Splits an observer's failure text (a Python traceback as
// traceback.format_exc() writes it, or the message of a core error) into an
// ErrorDetail. Text that is not a traceback gives type `fallback_type`.
ErrorDetail DescribeFailure(std::string_view text, std::string_view fallback_type = "Error");
// The type of a failure whose text names none (no Python traceback): the
// exception a status of that kind becomes in Python ("SinkUnavailable" for
// an outage a native sink reported, "SinkRefused"), else "Error".
std::string_view FailureType(SinkFailure sink);

// The failures of one notification's work, or of one key of a queue bucket.
struct WorkRecord {
  std::string observer;            // the observer's name (a queue's processor's, for keyed work)
  std::string cell_key;            // the notification's encoded cell key (encoding.h)
  std::optional<std::string> key;  // keyed work: the queue key (as queued)
  uint32_t attempts = 0;
  bool parked = false;
  SinkFailure sink = SinkFailure::kNone;  // the last failure's, see Outages above
  double first_failure_unix = 0;
  double last_failure_unix = 0;
  ErrorDetail error;  // the last failure's
};

// The failure history of one observer.
struct FailureSummary {
  std::string observer;
  uint64_t failures = 0;  // failed runs
  uint64_t parked = 0;    // times work was parked
  double first_failure_unix = 0;
  double last_failure_unix = 0;
  std::string last_cell_key;  // the cell of the last failure
  ErrorDetail last_error;
};

// How many records one retry transaction handles.
constexpr size_t kRetryChunk = 1000;

// The work record of the notification of `cell_key`, in the transaction's snapshot.
std::optional<WorkRecord> ReadWorkRecord(Transaction& transaction, std::string_view cell_key);

// In a run that is about to commit: deletes its notification's work record.
void ForgetWorkRecord(Transaction& transaction, std::string_view cell_key);

// Records a failed run of `observer` on the notification of `cell_key`, in
// transactions of its own begun from `source` (retried on conflicts); parks
// the work when its attempts reach max_attempts (0: never). A `sink`
// failure counts as Outages above says.
// Returns the record as written; an empty one (no cell_key) when the
// notification is no longer pending, so nothing was recorded. Throws what
// the store throws (kClosed once it closes).
WorkRecord RecordFailure(TransactionSource& source, const std::string& observer,
                         const std::string& cell_key, const ErrorDetail& error,
                         uint32_t max_attempts, double now_unix,
                         SinkFailure sink = SinkFailure::kNone);

// In a queue bucket's run (its transaction): parks `key`, whose work
// failed `attempts` times since `first_failure_unix` (the bucket's first
// failed run), as keyed work of the notification `cell_key`, and counts it
// in the observer's failure summary.
void ParkKey(Transaction& transaction, const std::string& observer, const std::string& cell_key,
             std::string_view key, const ErrorDetail& error, uint32_t attempts,
             double first_failure_unix, double now_unix);

// Reports keys parked on this thread: while a ParkReporter lives on a
// thread, ParkKey there hands each parked key's record to `report` once the
// run's transaction commits (Transaction::AfterCommit). The worker pool sets
// one around each run (WorkerOptions::on_failure).
class ParkReporter {
 public:
  explicit ParkReporter(std::function<void(const WorkRecord&)> report);
  ~ParkReporter();
  ParkReporter(const ParkReporter&) = delete;
  ParkReporter& operator=(const ParkReporter&) = delete;

 private:
  friend void ParkKey(Transaction&, const std::string&, const std::string&, std::string_view,
                      const ErrorDetail&, uint32_t, double, double);
  std::function<void(const WorkRecord&)> report_;
  ParkReporter* previous_;
};

// The parked keys of the notification `cell_key` (a queue bucket's), in the
// transaction's view.
std::vector<std::string> ParkedKeys(Transaction& transaction, std::string_view cell_key);

// Every work record in the transaction's snapshot (parked ones only when
// `parked_only`): observers' work in cell order, then keyed work.
std::vector<WorkRecord> ListWorkRecords(Transaction& transaction, bool parked_only);

// Every observer's failure summary in the transaction's snapshot.
std::vector<FailureSummary> ListFailureSummaries(Transaction& transaction);

// Puts the parked work for which `match` is true back to run; returns how
// many records it retried.
size_t RetryParked(TransactionSource& source, const std::function<bool(const WorkRecord&)>& match);

}  // namespace percolite
