// page_walk.h: walks every page of an LMDB data file the way LMDB 0.9 lays
// them out, without LMDB, for `percolite check`.
//
// LMDB's API shows entries, never pages, so damage to pages no entry leads
// through goes unseen: the free list above all, which a later commit trusts
// to hand out pages (a free-listed page still in use is overwritten; a
// bogus one can make the writer fault). WalkPages reads the snapshot named
// by `txnid` (its meta page is txnid & 1, as LMDB's readers choose) through
// `read_page`, walks the free-list tree, the main tree and every named tree,
// and checks that each page is in the file, carries its own number, has a
// sane header and nodes inside it, is reached once, and that the free list
// names only pages no tree uses, once each, so that every page is either a
// meta page, in a tree, or free.
//
// WalkScope::kFreeList proves the same accounting for much less: it reads the
// free list, the table list and every branch page, and reads a table's leaf
// pages only when the table's record says it has overflow pages (which only
// its leaves lead to); other leaves are claimed unread, from the branch page
// (or table record) naming them. A lying table record leaves pages
// unaccounted, which is reported like any other loss. Reads go to about one
// page in a hundred on a store of small values. Writers run it before their
// first commit: LMDB trusts the free list to hand out pages.
//
// Thread safety: a pure function of what read_page returns. The caller keeps
// the snapshot's read transaction open while it runs (LMDB never rewrites a
// page an open snapshot can reach).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace percolite {

// Reads the first `length` bytes (at most a page) of page `pgno` into *out;
// false when the file ends first.
using PageReader = std::function<bool(uint64_t pgno, size_t length, std::string* out)>;

enum class WalkScope {
  kEveryPage,  // every page read and its header and nodes checked (percolite check)
  kFreeList,   // what proves the free list names only unused pages (before writing)
};

// The problems found (empty when none), at most `limit` of them; nullopt
// when the snapshot's meta page was already reused by two later commits
// (walk a newer snapshot). `file_pages` is how many pages the file holds.
std::optional<std::vector<std::string>> WalkPages(uint64_t txnid, uint32_t page_size,
                                                  uint64_t file_pages, const PageReader& read_page,
                                                  WalkScope scope = WalkScope::kEveryPage,
                                                  size_t limit = 20);

}  // namespace percolite
