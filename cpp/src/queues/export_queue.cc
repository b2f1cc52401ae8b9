#include "percolite/export_queue.h"

#include <algorithm>

#include "percolite/encoding.h"
#include "percolite/transaction.h"
#include "queue_rows.h"

namespace percolite {
namespace {

constexpr std::string_view kEntryFamily = queue_rows::kExportEntryFamily;
constexpr std::string_view kKind = "export queue";  // in messages and the processor's name

}  // namespace

std::shared_ptr<ExportQueue> ExportQueue::Create(ExportQueueOptions options) {
  queue_rows::CheckOptions(kKind, options.id, options.buckets, "batch_size", options.batch_size);
  if (!options.exporter)
    throw Error(ErrorCode::kInvalidArgument, "an export queue needs an exporter");
  return std::shared_ptr<ExportQueue>(new ExportQueue(std::move(options)));
}

ExportQueue::ExportQueue(ExportQueueOptions options)
    : options_(std::move(options)),
      family_("eq:" + options_.id),
      linger_(std::make_shared<queue_rows::Linger>(kKind, options_.id, options_.linger_seconds)) {}

uint32_t ExportQueue::BucketOf(std::string_view key) const {
  return static_cast<uint32_t>(StableHash64(key, 13) % options_.buckets);
}

void ExportQueue::Add(Transaction& transaction, std::string_view key,
                      std::string_view value) const {
  Add(transaction, {{std::string(key), std::string(value)}});
}

void ExportQueue::Add(Transaction& transaction,
                      const std::vector<std::pair<std::string, std::string>>& entries) const {
  constexpr size_t kLimit = size_t{1} << kSeqIndexBits;
  if (transaction.StampedCount() + entries.size() > kLimit) {
    throw Error(ErrorCode::kInvalidArgument, "export queue '" + options_.id +
                                                 "': a transaction may add at most " +
                                                 std::to_string(kLimit) + " queued entries");
  }
  queue_rows::Write(
      transaction, options_.id, "e", kEntryFamily, family_, options_.buckets,
      [this](std::string_view key) { return BucketOf(key); }, entries);
}

ObservedColumn ExportQueue::NotifyColumn() const {
  return queue_rows::ProcessorColumn(kKind, options_.id, family_);
}

Observer ExportQueue::AsObserver() const {
  Observer observer = queue_rows::ProcessorObserver(kKind, options_.id, family_, Processor());
  observer.sink = sink_;
  return observer;
}

ObserverFn ExportQueue::Processor() const {
  std::shared_ptr<const ExportQueue> self = shared_from_this();
  return [self](const std::shared_ptr<Transaction>& transaction, const Cell& cell) {
    try {
      return self->Process(transaction, cell);
    } catch (const Error& e) {
      return e.ToStatus();
    }
  };
}

Status ExportQueue::Process(const std::shared_ptr<Transaction>& transaction,
                            const Cell& cell) const {
  const std::string what = "export queue '" + options_.id + "'";
  queue_rows::BucketStrategy strategy;
  strategy.what = what;
  strategy.id = &options_.id;
  strategy.family = &family_;
  strategy.entry_kind = kEntryFamily;
  strategy.batch = options_.batch_size;
  strategy.resume_after_cursor = true;
  strategy.linger = linger_.get();
  strategy.observer = NotifyColumn().observer;
  strategy.max_attempts = options_.max_attempts;
  strategy.batches = &batches_;
  strategy.entries = &entries_;
  // Read once per run, in its snapshot: every call of the run (the halves
  // of a split too) names the same store and epoch.
  std::optional<StoreIdentity> store;
  strategy.consume = [&](Transaction& transaction, const std::vector<queue_rows::Entry>& queued) {
    if (!store) store = ReadStoreIdentity(transaction).value_or(StoreIdentity{});
    return Export(what, queued, *store);
  };
  return queue_rows::ProcessBucket(strategy, *transaction, cell);
}

Status ExportQueue::Export(const std::string& what, const std::vector<queue_rows::Entry>& queued,
                           const StoreIdentity& store) const {
  std::vector<ExportEntry> batch;
  batch.reserve(queued.size());
  for (const queue_rows::Entry& entry : queued) {
    if (entry.commit_ts >= kMaxSeqCommitTs || entry.index >= (uint32_t{1} << kSeqIndexBits)) {
      return Status::Make(ErrorCode::kCorruption, what + ": a queued entry's stamp is too large");
    }
    batch.push_back(ExportEntry{std::string(entry.key()), std::string(entry.value),
                                Seq(entry.commit_ts, entry.index)});
  }
  // Read in commit order; the exporter gets them by key, then seq.
  std::stable_sort(batch.begin(), batch.end(),
                   [](const ExportEntry& a, const ExportEntry& b) { return a.key < b.key; });
  return options_.exporter(batch, store);
}

}  // namespace percolite
