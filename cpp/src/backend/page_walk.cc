#include "page_walk.h"

#include <array>
#include <cstring>
#include <optional>

namespace percolite {
namespace {

// LMDB 0.9's layout (mdb.c): a 16-byte page header (pgno 8, pad 2, flags 2,
// lower 2 and upper 2, or an overflow run's page count 4), then node offsets;
// a node is lo 2, hi 2, flags 2, key size 2, key, data. A meta page holds,
// after the header, magic, version, address, map size, the free and main
// trees' records (48 bytes each: depth at +6, the counts of branch, leaf and
// overflow pages at +8, +16, +24, root at +40), the last page and the txnid.
constexpr size_t kHeader = 16;
constexpr uint16_t kBranch = 0x01, kLeaf = 0x02, kOverflow = 0x04;
constexpr uint16_t kBigData = 0x01, kSubData = 0x02;
constexpr uint64_t kNoPage = ~uint64_t{0};
constexpr size_t kDbRecord = 48, kDbDepth = 6, kDbBranchPages = 8, kDbLeafPages = 16,
                 kDbOverflowPages = 24, kDbRoot = 40;
constexpr size_t kFreeDb = kHeader + 24, kMainDb = kFreeDb + kDbRecord;
constexpr size_t kLastPage = kHeader + 120, kMetaTxnid = kHeader + 128;
constexpr int kMaxDepth = 32;  // LMDB's cursor stack

template <typename T>
T At(const std::string& page, size_t offset) {
  T value;
  std::memcpy(&value, page.data() + offset, sizeof value);
  return value;
}

class Walk {
 public:
  Walk(uint32_t page_size, const PageReader& read, WalkScope scope, size_t limit)
      : page_size_(page_size), read_(read), scope_(scope), limit_(limit) {}

  std::optional<std::vector<std::string>> Run(uint64_t txnid, uint64_t file_pages) {
    std::string meta;
    if (!read_(txnid & 1, page_size_, &meta)) {
      return std::vector<std::string>{"the meta page of transaction " + std::to_string(txnid) +
                                      " cannot be read"};
    }
    // Two later commits reuse the snapshot's meta page (the tree pages it
    // reaches stay, held by the caller's read transaction): read it again
    // from a newer snapshot.
    if (At<uint64_t>(meta, kMetaTxnid) != txnid) return std::nullopt;
    last_ = At<uint64_t>(meta, kLastPage);
    if (last_ < 1 || last_ >= file_pages) {
      return std::vector<std::string>{"the meta page of transaction " + std::to_string(txnid) +
                                      " says the last page is " + std::to_string(last_) +
                                      ", the file holds " + std::to_string(file_pages) + " pages"};
    }
    used_.assign(last_ + 1, 0);
    used_[0] = used_[1] = 1;
    const uint64_t free_root = At<uint64_t>(meta, kFreeDb + kDbRoot);
    const uint64_t main_root = At<uint64_t>(meta, kMainDb + kDbRoot);
    Tree(free_root, "the free list", Kind::kFree);
    Tree(main_root, "the table list", Kind::kMain);
    for (const Named& table : named_) {
      // Leaves sit at depth md_depth - 1 (the root is depth 0). Unless the
      // table has overflow runs, kFreeList claims them without reading them.
      const bool read_leaves = scope_ == WalkScope::kEveryPage || table.pages[2] > 0;
      leaf_depth_ = read_leaves ? -1 : static_cast<int>(table.depth) - 1;
      const size_t problems_before = problems_.size();
      walked_ = {};
      Tree(table.root, "table '" + table.name + "'", Kind::kTable);
      // A whole walk also holds the record's page counts to what it found.
      if (scope_ == WalkScope::kEveryPage && problems_.size() == problems_before &&
          walked_ != table.pages) {
        Problem("table '" + table.name + "': its record counts " + Pages(table.pages) +
                ", its tree holds " + Pages(walked_));
      }
    }
    CheckFree();
    return problems_;
  }

 private:
  enum class Kind { kFree, kMain, kTable };
  using PageCounts = std::array<uint64_t, 3>;  // branch, leaf and overflow pages

  static std::string Pages(const PageCounts& counts) {
    return std::to_string(counts[0]) + " branch, " + std::to_string(counts[1]) + " leaf and " +
           std::to_string(counts[2]) + " overflow pages";
  }

  void Problem(const std::string& text) {
    if (problems_.size() < limit_) problems_.push_back(text);
  }

  // Marks `pgno` used by `tree`; false (a problem) when it cannot be.
  bool Claim(uint64_t pgno, const std::string& tree) {
    if (pgno > last_) {
      Problem(tree + ": page " + std::to_string(pgno) + " is past the file's last page " +
              std::to_string(last_));
      return false;
    }
    if (used_[pgno]) {
      Problem(tree + ": page " + std::to_string(pgno) + " is reached twice");
      return false;
    }
    used_[pgno] = 1;
    return true;
  }

  void Tree(uint64_t root, const std::string& tree, Kind kind) {
    if (root != kNoPage) Page(root, tree, kind, 0);
  }

  void Page(uint64_t pgno, const std::string& tree, Kind kind, int depth) {
    if (depth > kMaxDepth) return Problem(tree + ": deeper than LMDB allows");
    if (!Claim(pgno, tree)) return;
    if (depth == leaf_depth_ && kind == Kind::kTable) return;  // a leaf kFreeList need not read
    std::string page;
    const std::string where = tree + ": page " + std::to_string(pgno);
    if (!read_(pgno, page_size_, &page)) return Problem(where + " cannot be read");
    if (At<uint64_t>(page, 0) != pgno) return Problem(where + " carries another page's number");
    const uint16_t flags = At<uint16_t>(page, 10);
    const uint16_t lower = At<uint16_t>(page, 12), upper = At<uint16_t>(page, 14);
    const bool branch = flags & kBranch, leaf = flags & kLeaf;
    if (branch == leaf || lower < kHeader || lower > upper || upper > page_size_) {
      return Problem(where + " has a damaged header");
    }
    ++walked_[branch ? 0 : 1];
    const size_t keys = (lower - kHeader) / 2;
    for (size_t i = 0; i < keys; ++i) {
      const uint16_t offset = At<uint16_t>(page, kHeader + 2 * i);
      if (offset < upper || size_t{offset} + 8 > page_size_) {
        return Problem(where + " has a node outside it");
      }
      const uint16_t lo = At<uint16_t>(page, offset), hi = At<uint16_t>(page, offset + 2);
      const uint16_t node_flags = At<uint16_t>(page, offset + 4);
      const uint16_t key_size = At<uint16_t>(page, offset + 6);
      const size_t data = offset + 8 + size_t{key_size};
      if (data > page_size_) return Problem(where + " has a key running past its end");
      if (branch) {
        const uint64_t child = lo | (uint64_t{hi} << 16) | (uint64_t{node_flags} << 32);
        Page(child, tree, kind, depth + 1);
        continue;
      }
      const uint64_t size = lo | (uint64_t{hi} << 16);
      std::optional<std::string> value;  // the node's data, when this walk needs it
      if (node_flags & kBigData) {
        if (data + 8 > page_size_) return Problem(where + " has a value running past its end");
        value = Overflow(At<uint64_t>(page, data), size, where, kind == Kind::kFree);
        if (!value) return;
      } else {
        if (data + size > page_size_) return Problem(where + " has a value running past its end");
        if (kind != Kind::kTable) value = page.substr(data, size);
      }
      if (kind == Kind::kMain && (node_flags & kSubData)) {
        if (value->size() != kDbRecord) return Problem(where + " holds a damaged table record");
        named_.push_back(
            Named{page.substr(offset + 8, key_size),
                  At<uint64_t>(*value, kDbRoot),
                  At<uint16_t>(*value, kDbDepth),
                  {At<uint64_t>(*value, kDbBranchPages), At<uint64_t>(*value, kDbLeafPages),
                   At<uint64_t>(*value, kDbOverflowPages)}});
      } else if (kind == Kind::kFree) {
        FreeEntry(page.substr(offset + 8, key_size), *value, where);
      }
    }
  }

  // Claims an overflow run; its bytes when `want` (else an empty string).
  std::optional<std::string> Overflow(uint64_t first, uint64_t size, const std::string& where,
                                      bool want) {
    std::string page;
    // Only the run's header, unless its bytes are wanted.
    if (first > last_ || !read_(first, want ? page_size_ : kHeader, &page) ||
        At<uint64_t>(page, 0) != first || !(At<uint16_t>(page, 10) & kOverflow)) {
      Problem(where + ": its value's overflow page " + std::to_string(first) + " is damaged");
      return std::nullopt;
    }
    const uint32_t pages = At<uint32_t>(page, 12);
    if (pages == 0 || kHeader + size > uint64_t{pages} * page_size_) {
      Problem(where + ": its value does not fit the overflow run at page " + std::to_string(first));
      return std::nullopt;
    }
    std::string bytes = want ? page.substr(kHeader) : std::string();
    walked_[2] += pages;
    for (uint64_t p = first; p < first + pages; ++p) {
      if (!Claim(p, where + " (overflow)")) return std::nullopt;
      if (want && p > first) {
        if (!read_(p, page_size_, &page)) return std::nullopt;
        bytes += page;
      }
    }
    if (want) bytes.resize(size);
    return bytes;
  }

  // A free-list entry, under its transaction id (keys strictly increasing
  // in the walk's order): a count, then that many page numbers, strictly
  // decreasing as LMDB keeps them (LMDB takes a run of pages by checking
  // only its ends, so pages out of order can hand out a page in use).
  void FreeEntry(const std::string& key, const std::string& value, const std::string& where) {
    if (key.size() != 8) return Problem(where + " holds a free-list entry with a damaged key");
    const uint64_t txnid = At<uint64_t>(key, 0);
    if (last_free_txnid_ && txnid <= *last_free_txnid_) {
      return Problem(where + ": the free list's transaction ids are out of order");
    }
    last_free_txnid_ = txnid;
    if (value.size() < 8 || value.size() % 8 != 0 ||
        At<uint64_t>(value, 0) != value.size() / 8 - 1) {
      return Problem(where + " holds a damaged free-list entry");
    }
    const uint64_t count = value.size() / 8 - 1;
    for (uint64_t i = 1; i <= count; ++i) {
      const uint64_t pgno = At<uint64_t>(value, 8 * i);
      if (i > 1 && pgno >= At<uint64_t>(value, 8 * (i - 1))) {
        return Problem(where + " holds a free-list entry whose pages are out of order");
      }
      free_.push_back(pgno);
    }
  }

  void CheckFree() {
    for (uint64_t pgno : free_) {
      if (pgno > last_) {
        Problem("the free list names page " + std::to_string(pgno) + ", past the last page " +
                std::to_string(last_));
      } else if (used_[pgno] == 1) {
        Problem("the free list names page " + std::to_string(pgno) + ", which is in use");
      } else if (used_[pgno] == 2) {
        Problem("the free list names page " + std::to_string(pgno) + " twice");
      } else {
        used_[pgno] = 2;
      }
    }
    uint64_t unaccounted = 0;
    for (uint8_t state : used_) unaccounted += state == 0;
    if (unaccounted > 0) {
      Problem(std::to_string(unaccounted) + " of " + std::to_string(last_ + 1) +
              " pages are neither in use nor free (a damaged free list or tree lost them)");
    }
  }

  struct Named {  // a table, from its record in the table list
    std::string name;
    uint64_t root;
    uint16_t depth;
    PageCounts pages;
  };

  const uint32_t page_size_;
  const PageReader& read_;
  const WalkScope scope_;
  const size_t limit_;
  int leaf_depth_ = -1;
  PageCounts walked_{};  // the pages of the table being walked, as read  // the depth of the table
                         // being walked whose leaves go unread
  uint64_t last_ = 0;
  std::vector<uint8_t> used_;  // 0 unseen, 1 in a tree (or meta), 2 free
  std::vector<Named> named_;
  std::vector<uint64_t> free_;
  std::optional<uint64_t> last_free_txnid_;
  std::vector<std::string> problems_;
};

}  // namespace

std::optional<std::vector<std::string>> WalkPages(uint64_t txnid, uint32_t page_size,
                                                  uint64_t file_pages, const PageReader& read_page,
                                                  WalkScope scope, size_t limit) {
  return Walk(page_size, read_page, scope, limit).Run(txnid, file_pages);
}

}  // namespace percolite
