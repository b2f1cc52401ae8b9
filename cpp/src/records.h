// Small records percolite keeps in its own rows (failures.h, leases.h):
// fields written in order, big-endian, and read back the same way, plus the
// helpers their writers share.
//
// Thread safety: pure functions, and a Reader used by one thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "percolite/encoding.h"
#include "percolite/status.h"
#include "percolite/transaction.h"

namespace percolite {
namespace records {

inline void PutDouble(std::string* out, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  AppendUint64BE(out, bits);
}

inline void PutString(std::string* out, std::string_view value) {
  AppendUint64BE(out, value.size());
  out->append(value);
}

// Reads the fields PutDouble, AppendUint64BE and PutString wrote, in order;
// any read past the end leaves ok() false.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  bool ok() const { return ok_; }
  bool done() const { return pos_ == bytes_.size(); }
  char Byte() {
    if (!Need(1)) return 0;
    return bytes_[pos_++];
  }
  uint64_t U64() {
    if (!Need(8)) return 0;
    const uint64_t value = ReadUint64BE(bytes_.substr(pos_, 8));
    pos_ += 8;
    return value;
  }
  double Double() {
    const uint64_t bits = U64();
    double value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }
  std::string String() {
    const uint64_t size = U64();
    if (!Need(size)) return {};
    std::string value(bytes_.substr(pos_, size));
    pos_ += size;
    return value;
  }

 private:
  bool Need(uint64_t n) {
    if (!ok_ || n > bytes_.size() - pos_) {
      ok_ = false;
      return false;
    }
    return true;
  }
  std::string_view bytes_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Every cell of (row, family) in the transaction's view, copied first (the
// visitor may then use the transaction): visit(qualifier, value).
inline void VisitFamily(Transaction& transaction, const std::string& row, std::string_view family,
                        const std::function<void(std::string_view, std::string_view)>& visit) {
  ScanRange range;
  AppendEscapedPart(&range.from, row);
  AppendEscapedPart(&range.from, family);
  range.end = PrefixSuccessor(range.from);
  std::vector<std::pair<std::string, std::string>> found;
  transaction.Visit(range, nullptr, [&](std::string_view key, std::string_view value) {
    found.emplace_back(key, value);
    return true;
  });
  Cell cell;
  for (const auto& [key, value] : found) {
    if (!DecodeCellKey(key, &cell)) {
      throw Error(ErrorCode::kCorruption, "a malformed cell key among percolite's own rows");
    }
    visit(cell.qualifier, value);
  }
}

// A short jittered sleep before retrying a transaction that conflicted for
// the `tries`-th time.
inline void Backoff(int tries) {
  thread_local std::mt19937_64 random{std::random_device{}()};
  const double ms = std::uniform_real_distribution<double>(0.2, 1.0)(random) * std::min(tries, 20);
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

inline double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace records
}  // namespace percolite
