// sink_rows.cc: reading a batch for a native sink (sink_rows.h).
#include "sink_rows.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "percolite/encoding.h"
#include "percolite/status.h"

namespace percolite {
namespace {

size_t FixedWidth(const std::vector<SinkCell>& cells) {
  if (WholeCell(cells)) return 0;
  for (SinkCell cell : cells) {
    if (cell == SinkCell::kText || cell == SinkCell::kBlob) {
      throw Error(ErrorCode::kInvalidArgument, "a text or blob cell must be the only one");
    }
  }
  if (cells.empty()) throw Error(ErrorCode::kInvalidArgument, "no cells");
  return 8 * cells.size();
}

}  // namespace

double SinkDouble(std::string_view bytes) {
  const uint64_t bits = ReadUint64BE(bytes);
  double v;
  std::memcpy(&v, &bits, 8);
  return v;
}

SinkCells::SinkCells(std::vector<SinkCell> key_cells, std::vector<SinkCell> value_cells)
    : key_(std::move(key_cells)),
      value_(std::move(value_cells)),
      key_width_(FixedWidth(key_)),
      value_width_(FixedWidth(value_)) {}

bool SinkCells::Collapse(const std::vector<ExportEntry>& entries,
                         std::vector<SinkRow>* rows) const {
  rows->reserve(entries.size());
  for (const ExportEntry& entry : entries) {
    std::string_view value(entry.value);
    if (value.empty() || (value[0] != '\0' && value[0] != '\1')) return false;
    const bool present = value[0] == '\1';
    value.remove_prefix(1);
    if (!Fits(entry.key, true)) return false;
    if (present && !Fits(value, false)) return false;
    // Entries come by key, then seq: the last of a run of one key is its newest.
    if (!rows->empty() && rows->back().key == entry.key) {
      if (entry.seq > rows->back().seq)
        rows->back() = SinkRow{entry.key, value, present, entry.seq};
      continue;
    }
    if (!rows->empty() && rows->back().key > std::string_view(entry.key)) return false;
    rows->push_back(SinkRow{entry.key, value, present, entry.seq});
  }
  return true;
}

bool SinkCells::Fits(std::string_view data, bool key) const {
  const std::vector<SinkCell>& cells = key ? key_ : value_;
  const size_t width = key ? key_width_ : value_width_;
  if (width == 0) return true;
  if (data.size() != width) return false;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (cells[i] != SinkCell::kFloat64) continue;
    const double v = SinkDouble(data.substr(8 * i, 8));
    // NaN and infinities are refused by the exporters; -0.0 keys are
    // merged with 0.0 by them.
    if (!std::isfinite(v) || (key && v == 0 && std::signbit(v))) return false;
  }
  return true;
}

}  // namespace percolite
