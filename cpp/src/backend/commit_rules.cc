#include "commit_rules.h"

#include <cstdio>

namespace percolite {

std::string DescribeKey(std::string_view encoded) {
  Cell cell;
  if (!DecodeCellKey(encoded, &cell)) return "an internal key";
  auto repr = [](const std::string& s) {
    std::string out = "b'";
    size_t shown = 0;
    for (unsigned char c : s) {
      if (++shown > 60) {
        out += "...";
        break;
      }
      if (c == '\\' || c == '\'') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c >= 32 && c < 127) {
        out += static_cast<char>(c);
      } else {
        char buf[5];
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      }
    }
    return out + "'";
  };
  return "row " + repr(cell.row) + " column (" + repr(cell.family) + ", " + repr(cell.qualifier) +
         ")";
}

bool StrongColumns::Load(std::string_view stored) {
  if (stored == stored_ && (!stored.empty() || tails_.empty())) return true;
  std::vector<ObservedColumn> columns;
  if (!DecodeObservedColumns(stored, &columns)) return false;
  stored_.assign(stored);
  tails_.clear();
  for (const ObservedColumn& c : columns) {
    if (c.kind != NotifyKind::kStrong) continue;
    std::string tail;
    AppendEscapedPart(&tail, c.family);
    AppendEscapedPart(&tail, c.qualifier);
    tails_.insert(std::move(tail));
  }
  return true;
}

bool StrongColumns::Match(std::string_view key, std::string* row) const {
  size_t parts[3], pos = 0;
  return CellKeyParts(key, &parts) && tails_.count(key.substr(parts[1])) &&
         ReadEscapedPart(key, &pos, row);
}

}  // namespace percolite
