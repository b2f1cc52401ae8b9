#include "percolite/failures.h"

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "records.h"

namespace percolite {
namespace {

using records::Backoff;
using records::PutDouble;
using records::PutString;
using records::Reader;
using records::VisitFamily;

// Rows and families of the records (failures.h).
const std::string kWorkRow = kSystemRowPrefix + "work";
const std::string kSummaryRow = kSystemRowPrefix + "failures";
const std::string kKeyedRow = kSystemRowPrefix + "keys";
constexpr std::string_view kWorkFamily = "w";
constexpr std::string_view kKeyedFamily = "k";
constexpr std::string_view kSummaryFamily = "f";

// Version 2 added the sink byte (SinkFailure); version 1 records still read.
constexpr char kWorkVersion = 2;
constexpr char kSummaryVersion = 1;
// Recording a failure retries its transaction this often on conflicts (runs
// failing at once on other threads or processes write the same summary).
constexpr int kRecordTries = 200;

void PutError(std::string* out, const ErrorDetail& error) {
  PutString(out, error.type);
  PutString(out, error.message);
  PutString(out, error.traceback);
}

ErrorDetail ReadError(Reader* in) {
  ErrorDetail error;
  error.type = in->String();
  error.message = in->String();
  error.traceback = in->String();
  return error;
}

std::string EncodeWork(const WorkRecord& r) {
  std::string out(1, kWorkVersion);
  out.push_back(r.parked ? 1 : 0);
  out.push_back(static_cast<char>(r.sink));
  AppendUint64BE(&out, r.attempts);
  PutDouble(&out, r.first_failure_unix);
  PutDouble(&out, r.last_failure_unix);
  PutString(&out, r.observer);
  PutError(&out, r.error);
  return out;
}

Error Malformed(const char* what, std::string_view key) {
  return Error(ErrorCode::kCorruption, std::string("malformed ") + what + " record in the store (" +
                                           std::to_string(key.size()) +
                                           "-byte key): it was not written by this version");
}

WorkRecord DecodeWork(std::string_view cell_key, std::string_view bytes) {
  Reader in(bytes);
  WorkRecord r;
  r.cell_key = std::string(cell_key);
  const char version = in.Byte();
  r.parked = in.Byte() != 0;
  if (version >= 2) {
    const char sink = in.Byte();
    if (sink < 0 || sink > static_cast<char>(SinkFailure::kRefused))
      throw Malformed("work", cell_key);
    r.sink = static_cast<SinkFailure>(sink);
  }
  r.attempts = static_cast<uint32_t>(in.U64());
  r.first_failure_unix = in.Double();
  r.last_failure_unix = in.Double();
  r.observer = in.String();
  r.error = ReadError(&in);
  if (!in.ok() || !in.done() || version < 1 || version > kWorkVersion) {
    throw Malformed("work", cell_key);
  }
  return r;
}

std::string EncodeSummary(const FailureSummary& s) {
  std::string out(1, kSummaryVersion);
  AppendUint64BE(&out, s.failures);
  AppendUint64BE(&out, s.parked);
  PutDouble(&out, s.first_failure_unix);
  PutDouble(&out, s.last_failure_unix);
  PutString(&out, s.last_cell_key);
  PutError(&out, s.last_error);
  return out;
}

FailureSummary DecodeSummary(std::string_view observer, std::string_view bytes) {
  Reader in(bytes);
  FailureSummary s;
  s.observer = std::string(observer);
  const char version = in.Byte();
  s.failures = in.U64();
  s.parked = in.U64();
  s.first_failure_unix = in.Double();
  s.last_failure_unix = in.Double();
  s.last_cell_key = in.String();
  s.last_error = ReadError(&in);
  if (!in.ok() || !in.done() || version != kSummaryVersion) throw Malformed("failure", observer);
  return s;
}

CellRef WorkCell(std::string_view cell_key) { return {kWorkRow, kWorkFamily, cell_key}; }

// Keyed work's qualifier: the notification's cell key, escaped and
// terminated (encoding.h), then the key: a notification's keys share a prefix.
std::string KeyedQualifier(std::string_view cell_key, std::string_view key) {
  std::string qualifier;
  AppendEscapedPart(&qualifier, cell_key);
  qualifier.append(key);
  return qualifier;
}

bool SplitKeyedQualifier(std::string_view qualifier, std::string* cell_key, std::string* key) {
  size_t pos = 0;
  if (!ReadEscapedPart(qualifier, &pos, cell_key)) return false;
  key->assign(qualifier.substr(pos));
  return true;
}

// Adds one failure (parking when `parked_now`) to the observer's summary, in `transaction`.
void CountFailure(Transaction& transaction, const std::string& observer,
                  const std::string& cell_key, const ErrorDetail& error, bool parked_now,
                  double now_unix);
CellRef SummaryCell(std::string_view observer) { return {kSummaryRow, kSummaryFamily, observer}; }

}  // namespace

std::string_view FailureType(SinkFailure sink) {
  switch (sink) {
    case SinkFailure::kDown:
      return "SinkUnavailable";
    case SinkFailure::kRefused:
      return "SinkRefused";
    case SinkFailure::kNone:
      break;
  }
  return "Error";
}

ErrorDetail DescribeFailure(std::string_view text, std::string_view fallback_type) {
  ErrorDetail detail;
  detail.traceback = std::string(text);
  // A Python traceback ends with the exception: the first line that is not
  // indented after the last frame line ("  File ..."), "Type: message" (the
  // message may run over several lines), or just "Type".
  constexpr std::string_view kHeader = "Traceback (most recent call last):";
  const size_t header = text.rfind(kHeader);
  if (header != std::string_view::npos) {
    size_t last_frame = text.rfind("\n  File ");
    size_t pos = last_frame == std::string_view::npos || last_frame < header
                     ? header + kHeader.size()
                     : last_frame + 1;
    // Skip the frame line and its indented source lines.
    while (pos < text.size()) {
      const size_t eol = text.find('\n', pos);
      const size_t next = eol == std::string_view::npos ? text.size() : eol + 1;
      if (text[pos] != ' ' && text[pos] != '\n') break;
      pos = next;
    }
    std::string_view exception = text.substr(pos);
    while (!exception.empty() && (exception.back() == '\n' || exception.back() == ' ')) {
      exception.remove_suffix(1);
    }
    if (!exception.empty()) {
      const size_t eol = exception.find('\n');
      const std::string_view first = exception.substr(0, eol);
      const size_t colon = first.find(": ");
      if (colon == std::string_view::npos) {
        detail.type = std::string(first);
        if (eol != std::string_view::npos) detail.message = std::string(exception.substr(eol + 1));
      } else {
        detail.type = std::string(first.substr(0, colon));
        detail.message = std::string(exception.substr(colon + 2));
      }
      // "module.Type" names the type by its last part, as Python prints it.
      return detail;
    }
  }
  detail.type = std::string(fallback_type);
  std::string_view message = text;
  while (!message.empty() && message.back() == '\n') message.remove_suffix(1);
  detail.message = std::string(message);
  return detail;
}

std::optional<WorkRecord> ReadWorkRecord(Transaction& transaction, std::string_view cell_key) {
  std::optional<std::string> value = transaction.Get(WorkCell(cell_key));
  if (!value) return std::nullopt;
  return DecodeWork(cell_key, *value);
}

void ForgetWorkRecord(Transaction& transaction, std::string_view cell_key) {
  transaction.Delete(WorkCell(cell_key));
}

WorkRecord RecordFailure(TransactionSource& source, const std::string& observer,
                         const std::string& cell_key, const ErrorDetail& error,
                         uint32_t max_attempts, double now_unix, SinkFailure sink) {
  for (int tries = 1;; ++tries) {
    std::shared_ptr<Transaction> transaction = source.Begin();
    try {
      WorkRecord record;
      bool parked_now = false;
      // Only work still pending gets a record: a run elsewhere may have
      // committed it since this one failed.
      const bool pending = transaction->NotificationPending(cell_key);
      if (pending) {
        if (std::optional<WorkRecord> old = ReadWorkRecord(*transaction, cell_key)) {
          record = std::move(*old);
        } else {
          record.cell_key = cell_key;
          record.first_failure_unix = now_unix;
        }
        record.observer = observer;
        const bool down = sink == SinkFailure::kDown;
        if (down && record.sink != SinkFailure::kDown) record.first_failure_unix = now_unix;
        record.sink = sink;
        if (!down) ++record.attempts;
        record.last_failure_unix = now_unix;
        record.error = error;
        const bool last = sink == SinkFailure::kRefused ||
                          (!down && max_attempts > 0 && record.attempts >= max_attempts);
        if (!record.parked && last) {
          record.parked = parked_now = true;
          transaction->SetTrigger(cell_key);  // consumed, as a run's commit would
        }
        transaction->Set(WorkCell(cell_key), EncodeWork(record));
      }
      CountFailure(*transaction, observer, cell_key, error, parked_now, now_unix);
      transaction->Commit();
      return record;
    } catch (const Error& e) {
      transaction->Abort();
      if (e.code() != ErrorCode::kConflict || tries >= kRecordTries) throw;
      Backoff(tries);
    }
  }
}

namespace {

void CountFailure(Transaction& transaction, const std::string& observer,
                  const std::string& cell_key, const ErrorDetail& error, bool parked_now,
                  double now_unix) {
  FailureSummary summary;
  if (std::optional<std::string> old = transaction.Get(SummaryCell(observer))) {
    summary = DecodeSummary(observer, *old);
  } else {
    summary.first_failure_unix = now_unix;
  }
  ++summary.failures;
  if (parked_now) ++summary.parked;
  summary.last_failure_unix = now_unix;
  summary.last_cell_key = cell_key;
  summary.last_error = error;
  transaction.Set(SummaryCell(observer), EncodeSummary(summary));
}

}  // namespace

namespace {
thread_local ParkReporter* t_park_reporter = nullptr;
}  // namespace

ParkReporter::ParkReporter(std::function<void(const WorkRecord&)> report)
    : report_(std::move(report)), previous_(t_park_reporter) {
  t_park_reporter = this;
}

ParkReporter::~ParkReporter() { t_park_reporter = previous_; }

void ParkKey(Transaction& transaction, const std::string& observer, const std::string& cell_key,
             std::string_view key, const ErrorDetail& error, uint32_t attempts,
             double first_failure_unix, double now_unix) {
  WorkRecord record;
  record.observer = observer;
  record.cell_key = cell_key;
  record.attempts = attempts;
  record.parked = true;
  record.first_failure_unix = first_failure_unix > 0 ? first_failure_unix : now_unix;
  record.last_failure_unix = now_unix;
  record.error = error;
  transaction.Set({kKeyedRow, kKeyedFamily, KeyedQualifier(cell_key, key)}, EncodeWork(record));
  CountFailure(transaction, observer, cell_key, error, true, now_unix);
  if (t_park_reporter != nullptr && t_park_reporter->report_) {
    record.key = std::string(key);
    transaction.AfterCommit(
        [report = t_park_reporter->report_, record = std::move(record)] { report(record); });
  }
}

std::vector<std::string> ParkedKeys(Transaction& transaction, std::string_view cell_key) {
  ScanRange range;
  AppendEscapedPart(&range.from, kKeyedRow);
  AppendEscapedPart(&range.from, kKeyedFamily);
  // Every qualifier of this notification's keys starts with the escaped cell
  // key, so their encoded cell keys share this prefix (the qualifier's own
  // escaping keeps the order and the prefix).
  std::string escaped;
  AppendEscapedPart(&escaped, cell_key);
  std::string qualifier_prefix;
  AppendEscapedPart(&qualifier_prefix, escaped);
  qualifier_prefix.resize(qualifier_prefix.size() - 2);  // drop the terminator
  range.from.append(qualifier_prefix);
  range.end = PrefixSuccessor(range.from);
  std::vector<std::string> keys;
  std::vector<std::string> cells;
  transaction.Visit(range, nullptr, [&](std::string_view key, std::string_view) {
    cells.emplace_back(key);
    return true;
  });
  Cell cell;
  std::string found_cell_key, found_key;
  for (const std::string& encoded : cells) {
    if (!DecodeCellKey(encoded, &cell) ||
        !SplitKeyedQualifier(cell.qualifier, &found_cell_key, &found_key)) {
      throw Malformed("keyed work", encoded);
    }
    if (found_cell_key == cell_key) keys.push_back(std::move(found_key));
  }
  return keys;
}

std::vector<WorkRecord> ListWorkRecords(Transaction& transaction, bool parked_only) {
  std::vector<WorkRecord> out;
  VisitFamily(transaction, kWorkRow, kWorkFamily,
              [&](std::string_view cell_key, std::string_view value) {
                WorkRecord record = DecodeWork(cell_key, value);
                if (!parked_only || record.parked) out.push_back(std::move(record));
              });
  std::string cell_key, key;
  VisitFamily(transaction, kKeyedRow, kKeyedFamily,
              [&](std::string_view qualifier, std::string_view value) {
                if (!SplitKeyedQualifier(qualifier, &cell_key, &key)) {
                  throw Malformed("keyed work", qualifier);
                }
                WorkRecord record = DecodeWork(cell_key, value);
                record.key = key;
                if (!parked_only || record.parked) out.push_back(std::move(record));
              });
  return out;
}

std::vector<FailureSummary> ListFailureSummaries(Transaction& transaction) {
  std::vector<FailureSummary> out;
  VisitFamily(transaction, kSummaryRow, kSummaryFamily,
              [&](std::string_view observer, std::string_view value) {
                out.push_back(DecodeSummary(observer, value));
              });
  return out;
}

size_t RetryParked(TransactionSource& source, const std::function<bool(const WorkRecord&)>& match) {
  size_t retried = 0;
  for (int tries = 1;;) {
    std::shared_ptr<Transaction> transaction = source.Begin();
    try {
      size_t chunk = 0;
      bool more = false;
      for (const WorkRecord& record : ListWorkRecords(*transaction, true)) {
        if (!match(record)) continue;
        if (chunk == kRetryChunk) {
          more = true;
          break;
        }
        Cell cell;
        if (!DecodeCellKey(record.cell_key, &cell)) throw Malformed("work", record.cell_key);
        if (record.key) {
          transaction->Delete(
              {kKeyedRow, kKeyedFamily, KeyedQualifier(record.cell_key, *record.key)});
        } else {
          ForgetWorkRecord(*transaction, record.cell_key);
        }
        transaction->SetWeakNotification({cell.row, cell.family, cell.qualifier});
        ++chunk;
      }
      transaction->Commit();
      retried += chunk;
      if (!more) return retried;
      tries = 1;
    } catch (const Error& e) {
      transaction->Abort();
      if (e.code() != ErrorCode::kConflict || tries >= kRecordTries) throw;
      Backoff(tries++);
    }
  }
}

}  // namespace percolite
