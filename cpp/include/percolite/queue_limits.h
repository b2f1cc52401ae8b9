// percolite/queue_limits.h: the limits both queues (combine_queue.h,
// export_queue.h) check when they are created, and the names their
// processors run under; the Python package reads them from percolite._core
// rather than repeating them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace percolite {

// Bucket rows are named by 6 decimal digits ("<id>:<kind>:000042").
constexpr uint32_t kMaxBuckets = 999999;

// The longest a short batch may wait for more entries (see Lingering in
// export_queue.h).
constexpr double kMaxLingerSeconds = 3600;

// The kinds of queue, as messages, layouts and processor names spell them.
constexpr std::string_view kCombineQueueKind = "combine queue";
constexpr std::string_view kExportQueueKind = "export queue";

// The observer name a queue's processor runs under: "<kind> <id>" ("combine
// queue totals"). Failure records keep it and operators name the processor by
// it, so it must not change. Throws kInvalidArgument unless `kind` is one of
// the two above.
std::string QueueProcessorName(std::string_view kind, std::string_view id);

// The (kind, id) that QueueProcessorName turned into `name`, or nullopt when
// `name` is no queue's processor. Only the exact prefixes "combine queue "
// and "export queue " count, followed by a non-empty id (no queue has an
// empty one): an observer of the user's may be named "my queue x", and
// splitting at " queue " would take it for a queue "x" of kind "my". The id
// is the rest of the name as it is, " queue " included.
std::optional<std::pair<std::string, std::string>> ParseQueueProcessorName(std::string_view name);

// Queued records as readers outside the queues see them (queue depths,
// `percolite check`): a bucket row keeps single-entry records in one family
// and packed records, several entries each, in another (queues/queue_rows.h
// has the layout). The families of packed records, of both queues:
std::vector<std::string> PackedQueueFamilies();
// The (key, value) entries of a packed record's value, viewing it; throws
// kInvalidArgument saying what is wrong when it does not decode.
std::vector<std::pair<std::string_view, std::string_view>> PackedQueueEntries(
    std::string_view value);
// The entry count in a packed record's header, or nullopt when the header
// does not decode.
std::optional<uint32_t> PackedQueueCount(std::string_view value);

}  // namespace percolite
