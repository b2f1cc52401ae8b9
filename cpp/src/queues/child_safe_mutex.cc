// child_safe_mutex.cc: the live ChildSafeMutex objects, renewed in a forked child.
#include "child_safe_mutex.h"

#include <pthread.h>

#include <new>
#include <set>

namespace percolite {
namespace {

// Never destroyed: mutexes may outlive static destruction.
std::mutex& LiveMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::set<ChildSafeMutex*>& Live() {
  static auto* live = new std::set<ChildSafeMutex*>;
  return *live;
}

void RenewInChild() {
  new (&LiveMutex()) std::mutex;
  for (ChildSafeMutex* mu : Live()) mu->Renew();
}

}  // namespace

ChildSafeMutex::ChildSafeMutex() {
  static const bool installed = (pthread_atfork(nullptr, nullptr, RenewInChild), true);
  (void)installed;
  std::lock_guard<std::mutex> lock(LiveMutex());
  Live().insert(this);
}

ChildSafeMutex::~ChildSafeMutex() {
  std::lock_guard<std::mutex> lock(LiveMutex());
  Live().erase(this);
}

}  // namespace percolite
