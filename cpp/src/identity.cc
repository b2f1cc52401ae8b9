#include "percolite/identity.h"

#include <random>

#include "percolite/failures.h"
#include "records.h"

namespace percolite {
namespace {

const std::string kIdentityRow = kSystemRowPrefix + "store";
constexpr std::string_view kIdentityFamily = "s";
constexpr std::string_view kIdentityQualifier = "identity";
constexpr char kIdentityVersion = 1;
constexpr int kEnsureTries = 200;

CellRef IdentityCell() { return {kIdentityRow, kIdentityFamily, kIdentityQualifier}; }

std::string Encode(const StoreIdentity& identity) {
  std::string out(1, kIdentityVersion);
  records::PutString(&out, identity.id);
  AppendUint64BE(&out, identity.epoch);
  return out;
}

std::string RandomHex(size_t bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::random_device device;
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned value = device() & 0xFF;
    out.push_back(kDigits[value >> 4]);
    out.push_back(kDigits[value & 0xF]);
  }
  return out;
}

}  // namespace

std::optional<StoreIdentity> ReadStoreIdentity(Transaction& transaction) {
  const std::optional<std::string> value = transaction.Get(IdentityCell());
  if (!value) return std::nullopt;
  records::Reader in(*value);
  StoreIdentity identity;
  const char version = in.Byte();
  identity.id = in.String();
  identity.epoch = in.U64();
  if (!in.ok() || !in.done() || version != kIdentityVersion || identity.id.empty()) {
    throw Error(ErrorCode::kCorruption, "malformed store identity record in the store");
  }
  return identity;
}

StoreIdentity EnsureStoreIdentity(TransactionSource& source, bool new_epoch) {
  for (int tries = 1;; ++tries) {
    std::shared_ptr<Transaction> transaction = source.Begin();
    try {
      std::optional<StoreIdentity> identity = ReadStoreIdentity(*transaction);
      if (identity && !new_epoch) {
        transaction->Abort();
        return *identity;
      }
      if (identity) {
        ++identity->epoch;
      } else {
        identity = StoreIdentity{RandomHex(16), 1};
      }
      transaction->Set(IdentityCell(), Encode(*identity));
      transaction->Commit();
      return *identity;
    } catch (const Error& e) {
      transaction->Abort();
      if (e.code() != ErrorCode::kConflict || tries >= kEnsureTries) throw;
      records::Backoff(tries);
    }
  }
}

}  // namespace percolite
