// percolite/identity.h: which store this is, for the sinks it feeds.
//
// Thread safety: the functions take a Transaction (used by one thread) or a
// TransactionSource (any thread); they keep no state of their own.
//
// Contract
// - Every store has an identity: 32 random hexadecimal digits, made the
//   first time the store is opened for writing (EnsureStoreIdentity) and
//   kept in percolite's own rows (failures.h, kSystemRowPrefix). Every
//   process and every backend reads the same one, and a copy of the store
//   keeps it. A ":memory:" store is new at every open, so is its identity.
// - And an epoch, from 1. A store opened as restored from a copy
//   (BackendOptions::restored) starts the next epoch: its clock may be
//   behind what its sinks already saw, so a sink orders entries by (epoch,
//   seq) and applies a new epoch's entries over an older epoch's rows.
// - The export queue hands both to its exporter with every batch
//   (export_queue.h), read in the run's own snapshot: a sink records the
//   store it belongs to beside its seq guard and refuses another's entries.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "percolite/transaction.h"

namespace percolite {

struct StoreIdentity {
  std::string id;      // 32 hexadecimal digits
  uint64_t epoch = 0;  // from 1
};

// The store's identity in the transaction's view; none before it was made.
std::optional<StoreIdentity> ReadStoreIdentity(Transaction& transaction);

// Makes the identity when the store has none, and with `new_epoch` starts
// its next epoch, in transactions of its own (retried on conflicts with
// other processes doing the same). Returns it as stored. Throws what the
// store throws (a store refusing commits: kCorruption, kStorage, kClosed).
StoreIdentity EnsureStoreIdentity(TransactionSource& source, bool new_epoch);

}  // namespace percolite
