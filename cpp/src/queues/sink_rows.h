// sink_rows.h: what every native sink (export_queue.h, "Native sinks")
// reads from a batch the same way: the cells of a queued key or value, and
// the newest entry of each key.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "percolite/export_queue.h"

namespace percolite {

// One key of a batch: its newest entry.
struct SinkRow {
  std::string_view key;
  std::string_view value;  // without the tag byte
  bool present;
  uint64_t seq;
};

// How a sink's keys and values map to cells (SinkCell).
class SinkCells {
 public:
  // Throws kInvalidArgument when a text or blob cell is not alone, or a
  // side has no cell.
  SinkCells(std::vector<SinkCell> key_cells, std::vector<SinkCell> value_cells);

  const std::vector<SinkCell>& key() const { return key_; }
  const std::vector<SinkCell>& value() const { return value_; }

  // The newest entry of each key of `entries` (by key, then seq, as the
  // queue hands them over), or false when a cell is one the exporter
  // refuses or stores differently (NaN, an infinity, a key of -0.0, bytes
  // of the wrong size): the exporter then takes the batch and names it.
  bool Collapse(const std::vector<ExportEntry>& entries, std::vector<SinkRow>* rows) const;

 private:
  bool Fits(std::string_view data, bool key) const;

  const std::vector<SinkCell> key_, value_;
  const size_t key_width_, value_width_;  // 0: one text or blob cell
};

// Whether `cells` is one text or blob cell, of all the bytes (else cells of
// 8 bytes each); such keys sort by value as they do by their bytes.
inline bool WholeCell(const std::vector<SinkCell>& cells) {
  return cells.size() == 1 && (cells[0] == SinkCell::kText || cells[0] == SinkCell::kBlob);
}

// The double of 8 big-endian bytes (a float64 cell).
double SinkDouble(std::string_view bytes);

// What the native sinks share: Deliver reads the batch (SinkCells) and
// hands its rows to Apply, and counts the batches applied and handed back.
class CountingSink : public NativeSink {
 public:
  std::optional<Status> Deliver(const std::vector<ExportEntry>& entries,
                                const StoreIdentity& store) final {
    std::vector<SinkRow> rows;
    std::optional<Status> outcome;
    if (cells_.Collapse(entries, &rows) && !rows.empty()) outcome = Apply(rows, store);
    (outcome ? applied_ : declined_).fetch_add(1);
    return outcome;
  }

  std::pair<uint64_t, uint64_t> Counters() const final {
    return {applied_.load(), declined_.load()};
  }

 protected:
  explicit CountingSink(SinkCells cells) : cells_(std::move(cells)) {}
  const SinkCells& cells() const { return cells_; }
  // The outcome of writing `rows` (one per key, in key order), or nullopt,
  // with nothing written, when the exporter must take the batch.
  virtual std::optional<Status> Apply(const std::vector<SinkRow>& rows,
                                      const StoreIdentity& store) = 0;

 private:
  const SinkCells cells_;
  std::atomic<uint64_t> applied_{0}, declined_{0};
};

}  // namespace percolite
