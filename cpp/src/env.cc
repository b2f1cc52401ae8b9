#include "percolite/env.h"

#include <vector>

#include "percolite/transaction.h"

namespace percolite {

std::shared_ptr<Env> Env::Open(const std::string& path, const StoreOptions& options) {
  std::shared_ptr<Store> store = Store::Acquire(path, options);
  std::string canonical = store->path();
  return std::shared_ptr<Env>(new Env(std::move(canonical), std::move(store)));
}

Env::Env(std::string path, std::shared_ptr<Store> store)
    : path_(std::move(path)), store_(std::move(store)) {}

Env::~Env() { Close(); }

bool Env::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return store_ == nullptr;
}

std::shared_ptr<Store> Env::store() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (store_ == nullptr) throw Error(ErrorCode::kClosed, "store '" + path_ + "' is closed");
  store_->CheckUsable();
  return store_;
}

StoreStats Env::Stats() const { return store()->Stats(); }

std::shared_ptr<Transaction> Env::Begin() {
  std::shared_ptr<Store> store = this->store();
  std::shared_ptr<Transaction> transaction(
      new Transaction(shared_from_this(), store->BeginSnapshot()));
  std::lock_guard<std::mutex> lock(mu_);
  if (store_ == nullptr) throw Error(ErrorCode::kClosed, "store '" + path_ + "' is closed");
  active_.emplace(transaction.get(), transaction);
  return transaction;
}

void Env::Forget(Transaction* transaction) {
  std::lock_guard<std::mutex> lock(mu_);
  active_.erase(transaction);
}

void Env::Close() {
  std::shared_ptr<Store> store;
  std::vector<std::shared_ptr<Transaction>> active;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (store_ == nullptr) return;
    store = std::move(store_);
    for (auto& [raw, weak] : active_) {
      if (auto strong = weak.lock()) active.push_back(std::move(strong));
    }
    active_.clear();
  }
  // Each abort waits for a commit already in flight on that transaction.
  for (auto& transaction : active) transaction->AbortFromEnvClose();
  active.clear();
  store->ReleaseHandle();
}

}  // namespace percolite
