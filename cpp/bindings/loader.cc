// _core.Loader: what a Python loader thread needs to keep hundreds of
// commits in flight. Commits are submitted with Transaction::CommitAsync; the
// backend's callback only appends the result to a queue here (no GIL, so the
// group-commit writer never waits for Python). The loader thread takes jobs
// posted by submitters and finished commits from the same queue (`next`,
// GIL released while it waits), and completes Python futures itself.
// `acquire` bounds the commits in flight: it blocks, GIL released, while
// `max_in_flight` are outstanding. `try_acquire` takes a free slot keeping
// the GIL: releasing it for a wait that does not happen would hand the GIL
// to the loader thread and make the submitter wait to get it back.
#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>

#include "bindings.h"
#include "errors.h"
#include "percolite/mutex.h"

namespace percolite::bindings {
namespace {

class Loader : public std::enable_shared_from_this<Loader> {
 public:
  explicit Loader(size_t max_in_flight) : max_in_flight_(max_in_flight) {}

  // Takes a slot for one more job; false when `timeout` seconds (< 0: no
  // limit) passed or the loader closed first.
  bool Acquire(double timeout) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (timeout < 0) {
      while (!SlotOrClosedLocked()) slots_cv_.Wait(&mu_);
    } else {
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
      bool woken = true;  // false once the deadline passed
      while (!SlotOrClosedLocked() && woken) woken = slots_cv_.WaitUntil(&mu_, deadline);
      if (!SlotOrClosedLocked()) return false;
    }
    if (closed_) return false;
    ++in_flight_;
    return true;
  }

  // A slot if one is free now (and the loader is open); never waits.
  bool TryAcquire() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (closed_ || in_flight_ >= max_in_flight_) return false;
    ++in_flight_;
    return true;
  }

  // Gives back `count` slots at once: the loader thread releases the slots
  // of a whole batch of events with one call and one wake-up.
  void Release(size_t count) EXCLUDES(mu_) {
    if (count == 0) return;
    {
      MutexLock lock(&mu_);
      in_flight_ -= count < in_flight_ ? count : in_flight_;
    }
    if (count == 1) {
      slots_cv_.Signal();
    } else {
      slots_cv_.SignalAll();
    }
    events_cv_.SignalAll();  // a flush may be waiting for the last one
  }

  // A job for the loader thread.
  void Post(uint64_t token) EXCLUDES(mu_) { Push(Event{token, false, CommitResult{}}); }

  // Submits `transaction`'s commit; its result reaches `Next` under `token`.
  void Commit(const std::shared_ptr<Transaction>& transaction, uint64_t token) {
    std::weak_ptr<Loader> self = weak_from_this();
    transaction->CommitAsync([self, token](const CommitResult& result) {
      if (auto loader = self.lock()) loader->Push(Event{token, true, result});
    });
  }

  // Up to `limit` events, waiting up to `timeout` seconds for the first:
  // (token, is_commit, exception or None, commit_ts).
  py::list Next(double timeout, size_t limit) EXCLUDES(mu_) {
    std::deque<Event> taken;
    {
      py::gil_scoped_release release;
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
      MutexLock lock(&mu_);
      bool woken = true;  // false once the deadline passed
      while (events_.empty() && !closed_ && woken) woken = events_cv_.WaitUntil(&mu_, deadline);
      while (!events_.empty() && taken.size() < limit) {
        taken.push_back(std::move(events_.front()));
        events_.pop_front();
      }
    }
    py::list out;
    for (const Event& e : taken) {
      py::object error = e.result.status.ok() ? py::none() : ExceptionFor(e.result.status);
      out.append(py::make_tuple(e.token, e.commit, error, e.result.commit_ts));
    }
    return out;
  }

  size_t in_flight() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return in_flight_;
  }

  // Wakes every waiter; Acquire refuses from now on.
  void Close() EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      closed_ = true;
    }
    slots_cv_.SignalAll();
    events_cv_.SignalAll();
  }

 private:
  struct Event {
    uint64_t token;
    bool commit;
    CommitResult result;
  };

  void Push(Event event) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      events_.push_back(std::move(event));
    }
    events_cv_.Signal();
  }

  bool SlotOrClosedLocked() const REQUIRES(mu_) { return closed_ || in_flight_ < max_in_flight_; }

  const size_t max_in_flight_;
  Mutex mu_;
  CondVar slots_cv_, events_cv_;
  std::deque<Event> events_ GUARDED_BY(mu_);
  size_t in_flight_ GUARDED_BY(mu_) = 0;
  bool closed_ GUARDED_BY(mu_) = false;
};

}  // namespace

void BindLoader(py::module_& m) {
  py::class_<Loader, std::shared_ptr<Loader>>(m, "Loader")
      .def(py::init<size_t>(), py::arg("max_in_flight"))
      .def("acquire", &Loader::Acquire, py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("try_acquire", &Loader::TryAcquire)
      .def("release", &Loader::Release, py::arg("count") = 1)
      .def("post", &Loader::Post, py::arg("token"))
      .def("commit", &Loader::Commit, py::arg("transaction"), py::arg("token"),
           py::call_guard<py::gil_scoped_release>())
      .def("next", &Loader::Next, py::arg("timeout"), py::arg("limit"))
      .def_property_readonly("in_flight", &Loader::in_flight)
      .def("close", &Loader::Close, py::call_guard<py::gil_scoped_release>());
}

}  // namespace percolite::bindings
