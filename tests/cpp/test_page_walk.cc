// The page walk (backend/page_walk.h) over pages built here, LMDB 0.9's
// layout: what it makes of the snapshot's meta page.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/page_walk.h"

namespace {

constexpr uint32_t kPage = 4096;
constexpr uint64_t kNoPage = ~uint64_t{0};

void Put(std::string* page, size_t offset, uint64_t value) {
  std::memcpy(page->data() + offset, &value, sizeof value);
}

// A store of two meta pages and nothing else: empty trees, last page 1.
std::vector<std::string> TwoMetaPages(uint64_t txnid_in_page, uint64_t last_page) {
  std::vector<std::string> pages(2, std::string(kPage, '\0'));
  for (uint64_t n = 0; n < 2; ++n) {
    std::string& meta = pages[n];
    Put(&meta, 0, n);
    Put(&meta, 16 + 24 + 40, kNoPage);  // the free tree's root
    Put(&meta, 16 + 72 + 40, kNoPage);  // the main tree's root
    Put(&meta, 16 + 120, last_page);
    Put(&meta, 16 + 128, txnid_in_page);
  }
  return pages;
}

percolite::PageReader Reader(const std::vector<std::string>& pages) {
  return [&pages](uint64_t pgno, size_t length, std::string* out) {
    if (pgno >= pages.size()) return false;
    *out = pages[pgno].substr(0, length);
    return true;
  };
}

}  // namespace

TEST_CASE("The page walk reads the snapshot's own meta page, or asks for a newer snapshot",
          "[page-walk]") {
  // Snapshot 5 reads meta page 1 (5 & 1). When it still holds transaction 5:
  // a sound empty store.
  const std::vector<std::string> same = TwoMetaPages(5, 1);
  auto problems = percolite::WalkPages(5, kPage, 2, Reader(same));
  REQUIRE(problems.has_value());
  CHECK(problems->empty());
  // Two commits later the page holds transaction 7, whose last page may lie
  // past what the file held when the walk began: not damage, a moved snapshot.
  const std::vector<std::string> moved = TwoMetaPages(7, 50);
  CHECK_FALSE(percolite::WalkPages(5, kPage, 2, Reader(moved)).has_value());
  // The snapshot's own meta page naming a page past the file is damage.
  const std::vector<std::string> past = TwoMetaPages(5, 50);
  problems = percolite::WalkPages(5, kPage, 2, Reader(past));
  REQUIRE(problems.has_value());
  REQUIRE(problems->size() == 1);
  CHECK(problems->front().find("says the last page is 50") != std::string::npos);
}
