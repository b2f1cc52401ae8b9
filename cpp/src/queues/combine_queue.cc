#include "percolite/combine_queue.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "percolite/encoding.h"
#include "percolite/transaction.h"
#include "queue_rows.h"

namespace percolite {
namespace {

constexpr std::string_view kUpdateFamily = queue_rows::kCombineUpdateFamily;
constexpr std::string_view kKind = "combine queue";  // in messages and the processor's name

int64_t ReadInt64(const char* p) {
  uint64_t u = ReadUint64BE(std::string_view(p, 8));
  int64_t v;
  std::memcpy(&v, &u, 8);
  return v;
}

void AppendInt64(std::string* out, int64_t v) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  AppendUint64BE(out, u);
}

double ReadFloat64(const char* p) {
  uint64_t u = ReadUint64BE(std::string_view(p, 8));
  double v;
  std::memcpy(&v, &u, 8);
  return v;
}

void AppendFloat64(std::string* out, double v) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  AppendUint64BE(out, u);
}

Status Invalid(const std::string& message) {
  return Status::Make(ErrorCode::kInvalidArgument, message);
}

}  // namespace

Status CombineNative(NativeCombiner combiner, ValueType type, size_t tuple_length,
                     const std::vector<std::string_view>& values,
                     std::optional<std::string>* result) {
  if (values.empty()) {
    result->reset();
    return Status::Ok();
  }
  if (combiner == NativeCombiner::kLast) {
    *result = std::string(values.back());
    return Status::Ok();
  }
  const size_t width = type == ValueType::kInt64Tuple ? tuple_length : 1;
  for (std::string_view v : values) {
    if (type == ValueType::kBytes || v.size() != 8 * width) {
      return Invalid("combining: a stored value has " + std::to_string(v.size()) +
                     " bytes, expected " + std::to_string(8 * width));
    }
  }
  std::string out;
  if (type == ValueType::kFloat64) {
    double acc = ReadFloat64(values[0].data());
    for (size_t i = 1; i < values.size(); ++i) {
      double x = ReadFloat64(values[i].data());
      if (combiner == NativeCombiner::kSum) acc += x;
      if (combiner == NativeCombiner::kMax) acc = std::fmax(acc, x);
      if (combiner == NativeCombiner::kMin) acc = std::fmin(acc, x);
    }
    if (combiner == NativeCombiner::kSum && acc == 0.0) {
      result->reset();
      return Status::Ok();
    }
    AppendFloat64(&out, acc);
    *result = std::move(out);
    return Status::Ok();
  }
  // int64 and int64 tuples, elementwise. Sums accumulate in 128 bits and only
  // the result must fit, so a compensating update can bring a key back in range.
  bool all_zero = true;
  for (size_t e = 0; e < width; ++e) {
    int64_t acc = ReadInt64(values[0].data() + 8 * e);
    __int128 sum = acc;
    for (size_t i = 1; i < values.size(); ++i) {
      int64_t x = ReadInt64(values[i].data() + 8 * e);
      if (combiner == NativeCombiner::kSum) {
        sum += x;
      } else if (combiner == NativeCombiner::kMax) {
        acc = std::max(acc, x);
      } else if (combiner == NativeCombiner::kMin) {
        acc = std::min(acc, x);
      }
    }
    if (combiner == NativeCombiner::kSum) {
      if (sum > INT64_MAX || sum < INT64_MIN) {
        return Invalid("combining: the int64 sum overflows");
      }
      acc = static_cast<int64_t>(sum);
    }
    all_zero = all_zero && acc == 0;
    AppendInt64(&out, acc);
  }
  if (combiner == NativeCombiner::kSum && all_zero) {
    result->reset();
    return Status::Ok();
  }
  *result = std::move(out);
  return Status::Ok();
}

std::shared_ptr<CombineQueue> CombineQueue::Create(CombineQueueOptions options) {
  queue_rows::CheckOptions(kKind, options.id, options.buckets, "buffer_size", options.buffer_size);
  if (options.native == NativeCombiner::kNone && !options.combiner) {
    throw Error(ErrorCode::kInvalidArgument, "a combine queue needs a combiner");
  }
  if (options.value_type == ValueType::kInt64Tuple && options.tuple_length < 1) {
    throw Error(ErrorCode::kInvalidArgument, "an int64 tuple value needs a length >= 1");
  }
  if (options.native != NativeCombiner::kNone && options.native != NativeCombiner::kLast &&
      options.value_type == ValueType::kBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "the native sum, max and min need int64, float64 or int64 tuple values");
  }
  return std::shared_ptr<CombineQueue>(new CombineQueue(std::move(options)));
}

CombineQueue::CombineQueue(CombineQueueOptions options)
    : options_(std::move(options)),
      family_("cq:" + options_.id),
      linger_(std::make_shared<queue_rows::Linger>(kKind, options_.id, options_.linger_seconds)) {}

uint32_t CombineQueue::BucketOf(std::string_view key) const {
  return static_cast<uint32_t>(StableHash64(key, 11) % options_.buckets);
}

std::string CombineQueue::BucketName(uint32_t bucket) const {
  return queue_rows::BucketName(bucket);
}

std::string CombineQueue::EntryRowPrefix() const {
  return options_.id + ":" + std::string(kUpdateFamily) + ":";
}

std::string CombineQueue::DataRowPrefix(uint32_t bucket) const {
  return options_.id + ":d:" + BucketName(bucket) + ":";
}

std::string CombineQueue::DataRow(std::string_view key) const {
  std::string row = DataRowPrefix(BucketOf(key));
  row.append(key);
  return row;
}

size_t CombineQueue::ValueSize() const {
  switch (options_.value_type) {
    case ValueType::kInt64:
    case ValueType::kFloat64:
      return 8;
    case ValueType::kInt64Tuple:
      return 8 * options_.tuple_length;
    case ValueType::kBytes:
      return 0;
  }
  return 0;
}

void CombineQueue::CheckValue(std::string_view key, std::string_view value) const {
  const size_t size = ValueSize();
  if (size != 0 && value.size() != size) {
    throw Error(ErrorCode::kInvalidArgument,
                "combine queue '" + options_.id + "': the value for key of " +
                    std::to_string(key.size()) + " bytes has " + std::to_string(value.size()) +
                    " bytes, expected " + std::to_string(size));
  }
}

void CombineQueue::Add(Transaction& transaction,
                       const std::vector<std::pair<std::string, std::string>>& updates) const {
  for (const auto& [key, value] : updates) CheckValue(key, value);  // all or nothing
  queue_rows::Write(
      transaction, options_.id, "u", kUpdateFamily, family_, options_.buckets,
      [this](std::string_view key) { return BucketOf(key); }, updates, /*packed=*/true);
}

std::optional<std::string> CombineQueue::Get(Transaction& transaction, std::string_view key) const {
  return transaction.Get({DataRow(key), kDataFamily, kDataQualifier});
}

ObservedColumn CombineQueue::NotifyColumn() const {
  return queue_rows::ProcessorColumn(kKind, options_.id, family_);
}

Observer CombineQueue::AsObserver() const {
  return queue_rows::ProcessorObserver(kKind, options_.id, family_, Processor());
}

ObserverFn CombineQueue::Processor() const {
  std::shared_ptr<const CombineQueue> self = shared_from_this();
  return [self](const std::shared_ptr<Transaction>& transaction, const Cell& cell) {
    try {
      return self->Process(transaction, cell);
    } catch (const Error& e) {
      return e.ToStatus();
    }
  };
}

Status CombineQueue::Combine(std::string_view key, const std::vector<std::string_view>& values,
                             std::optional<std::string>* result) const {
  if (options_.native != NativeCombiner::kNone) {
    return CombineNative(options_.native, options_.value_type, options_.tuple_length, values,
                         result);
  }
  Status status = options_.combiner(key, values, result);
  if (status.ok() && *result) CheckValue(key, **result);
  return status;
}

Status CombineQueue::Process(const std::shared_ptr<Transaction>& transaction,
                             const Cell& cell) const {
  const std::string what = "combine queue '" + options_.id + "'";
  queue_rows::BucketStrategy strategy;
  strategy.what = what;
  strategy.id = &options_.id;
  strategy.family = &family_;
  strategy.entry_kind = kUpdateFamily;
  strategy.packed = true;
  // A run takes whole records from the front of the bucket until it has at
  // least buffer_size updates, with the later records of their keys
  // (queue_rows::Read).
  strategy.batch = options_.buffer_size;
  strategy.whole_keys = true;
  strategy.linger = linger_.get();
  strategy.observer = NotifyColumn().observer;
  strategy.max_attempts = options_.max_attempts;
  strategy.batches = &batches_;
  strategy.entries = &entries_;
  strategy.consume = [&](Transaction&, const std::vector<queue_rows::Entry>& entries) {
    return Fold(transaction, entries);
  };
  return queue_rows::ProcessBucket(strategy, *transaction, cell);
}

Status CombineQueue::Fold(const std::shared_ptr<Transaction>& transaction,
                          const std::vector<queue_rows::Entry>& entries) const {
  // Each key's updates, keys in order (changes are reported, and values
  // written, in key order) and each key's updates in commit order (the order
  // read; the sort is stable). Only indexes move: the bytes stay where Read
  // put them, and values are views of them.
  std::vector<uint32_t> order(entries.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&entries](uint32_t a, uint32_t b) {
    return entries[a].key() < entries[b].key();
  });

  std::vector<Change> changes;
  std::vector<std::string_view> values;  // the current value, then the updates
  // The keys of a run are normally all of its bucket: one data row prefix.
  std::string data_prefix, data_row;
  uint32_t prefix_bucket = UINT32_MAX;
  for (size_t first = 0; first < order.size();) {
    const std::string_view key = entries[order[first]].key();
    size_t end = first + 1;
    while (end < order.size() && entries[order[end]].key() == key) ++end;
    const uint32_t bucket = BucketOf(key);
    if (bucket != prefix_bucket) {
      data_prefix = DataRowPrefix(bucket);
      prefix_bucket = bucket;
    }
    data_row.assign(data_prefix).append(key);  // DataRow(key), without allocating
    const CellRef data_cell{data_row, kDataFamily, kDataQualifier};
    std::optional<std::string> current = transaction->Get(data_cell);
    values.clear();
    if (current) values.push_back(*current);
    for (size_t i = first; i < end; ++i) values.push_back(entries[order[i]].value);
    first = end;
    // A Python combiner's calls may take long in all: a stop does not wait
    // for the rest of them (workers.h, Stop).
    if (options_.native == NativeCombiner::kNone && Workers::StopRequested()) {
      return Status::Make(ErrorCode::kClosed,
                          "combine queue '" + options_.id + "': the workers are stopping");
    }
    std::optional<std::string> combined;
    Status status = Combine(key, values, &combined);
    if (!status.ok()) return status;
    if (combined != current) {
      if (combined) {
        transaction->Set(data_cell, *combined);
      } else {
        transaction->Delete(data_cell);
      }
      changes.push_back(Change{std::string(key), std::move(current), std::move(combined)});
    }
  }
  if (changes.empty()) return Status::Ok();
  if (!options_.export_to.empty()) {
    std::vector<std::pair<std::string, std::string>> exported;
    exported.reserve(changes.size());
    for (const Change& change : changes) {
      exported.emplace_back(change.key, ExportValue(change.new_value));
    }
    for (const std::shared_ptr<const ExportQueue>& queue : options_.export_to) {
      queue->Add(*transaction, exported);
    }
  }
  if (options_.on_change) return options_.on_change(transaction, changes);
  return Status::Ok();
}

}  // namespace percolite
