#include "percolite/env.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "callables.h"
#include "convert.h"
#include "percolite/backend.h"
#include "percolite/combine_queue.h"
#include "percolite/encoding.h"
#include "percolite/export_queue.h"
#include "percolite/leases.h"
#include "percolite/workers.h"

namespace percolite::bindings {

namespace {

const char* OutcomeName(percolite::RunOutcome outcome) {
  switch (outcome) {
    case percolite::RunOutcome::kReady:
      return "ready";
    case percolite::RunOutcome::kCommitted:
      return "committed";
    case percolite::RunOutcome::kGone:
      return "gone";
    case percolite::RunOutcome::kConflict:
      return "conflict";
    case percolite::RunOutcome::kFailed:
      return "failed";
    case percolite::RunOutcome::kParked:
      return "parked";
    case percolite::RunOutcome::kSkippedParked:
      return "skipped";
    case percolite::RunOutcome::kDeferred:
      return "deferred";
    case percolite::RunOutcome::kNoObserver:
      return "no observer";
  }
  return "unknown";
}

// A worker pool's report of a work record (WorkerOptions::on_failure,
// on_recovery) as fn(record dict), called with the GIL on the worker
// thread; none when `fn` is None.
std::function<void(const percolite::ObservedColumn&, const percolite::WorkRecord&)> RecordCallback(
    py::object fn) {
  if (fn.is_none()) return nullptr;
  auto holder = std::make_shared<PyCallable>(std::move(fn));
  return [holder](const percolite::ObservedColumn&, const percolite::WorkRecord& record) {
    CallPython([&] {
      holder->fn(WorkRecordToDict(record));
      return percolite::Status::Ok();
    });
  };
}

// A run begun step by step (Workers::BeginRun), with the pool that began it.
struct PyBegunRun {
  std::shared_ptr<percolite::Workers> workers;
  percolite::BegunRun run;
};

using EnvClass = py::class_<PyEnv>;

// One spec of Env.set_observers: (family, qualifier, kind, name, runner[,
// max_attempts]). A queue (runner a CombineQueue or ExportQueue) runs as
// the queue says (AsObserver: its own column and name, retried forever);
// the package's spec of a queue names that same column and name.
percolite::Observer ObserverFromSpec(py::handle spec) {
  auto t = spec.cast<py::tuple>();
  percolite::Observer o;
  if (t.size() > 5) o.max_attempts = t[5].cast<uint32_t>();
  o.column.family = ToBytes(t[0], "column family");
  o.column.qualifier = ToBytes(t[1], "column qualifier");
  o.column.kind = static_cast<percolite::NotifyKind>(t[2].cast<int>());
  o.column.observer = t[3].cast<std::string>();
  if (py::isinstance<percolite::CombineQueue>(t[4])) {
    return t[4].cast<std::shared_ptr<percolite::CombineQueue>>()->AsObserver();
  }
  if (py::isinstance<percolite::ExportQueue>(t[4])) {
    return t[4].cast<std::shared_ptr<percolite::ExportQueue>>()->AsObserver();
  }
  o.fn = MakeObserverFn(py::reinterpret_borrow<py::object>(t[4]));
  return o;
}

// on_lease_change(owner, partitions, pools) of start_workers, called with
// the GIL; none when `fn` is None.
std::function<void(const std::string&, uint32_t, size_t)> LeaseChangeCallback(py::object fn) {
  if (fn.is_none()) return nullptr;
  auto holder = std::make_shared<PyCallable>(std::move(fn));
  return [holder](const std::string& owner, uint32_t partitions, size_t pools) {
    CallPython([&] {
      holder->fn(owner, partitions, pools);
      return percolite::Status::Ok();
    });
  };
}

py::dict RunHereSummaryToDict(const percolite::RunHereSummary& s) {
  py::dict d;
  d["runs"] = s.runs;
  d["commits"] = s.commits;
  d["conflicts"] = s.conflicts;
  d["failures"] = s.failures;
  d["parked"] = s.parked;
  d["deferrals"] = s.deferrals;
  d["failed"] = s.failed;
  d["stuck"] = s.stuck;
  d["error"] = s.error;
  py::list left;
  for (const auto& [c, observer] : s.left) {
    left.append(
        py::make_tuple(py::bytes(c.row), py::bytes(c.family), py::bytes(c.qualifier), observer));
  }
  d["left"] = left;
  d["left_total"] = s.left_total;
  return d;
}

py::dict WorkerStatsToDict(const percolite::WorkerStats& s) {
  py::dict d;
  d["running"] = s.running;
  d["threads"] = s.threads;
  d["queued"] = s.queued;
  d["active"] = s.active;
  d["committing"] = s.committing;
  d["scans"] = s.scans;
  if (s.lease_owner.empty()) {
    d["lease"] = py::none();
  } else {
    py::dict lease;
    lease["owner"] = s.lease_owner;
    lease["partitions"] = s.lease_partitions;
    lease["changes"] = s.lease_changes;
    d["lease"] = lease;
  }
  py::list observers;
  for (const auto& o : s.observers) observers.append(ObserverStatsToDict(o));
  d["observers"] = observers;
  return d;
}

py::dict CapabilitiesToDict(const percolite::BackendCapabilities& c) {
  py::dict d;
  d["name"] = c.name;
  d["persistent"] = c.persistent;
  d["cross_process"] = c.cross_process;
  d["durable"] = c.durable;
  d["max_value_size"] = c.max_value_size;
  return d;
}

py::dict LatencyToDict(const percolite::LatencyHistogram::Reading& r) {
  py::list buckets;  // (upper bound in seconds or None, cumulative count)
  for (size_t i = 0; i < percolite::LatencyHistogram::kBuckets; ++i) {
    py::object bound = py::none();
    if (i < percolite::LatencyHistogram::kBounds.size()) {
      bound = py::float_(percolite::LatencyHistogram::kBounds[i]);
    }
    buckets.append(py::make_tuple(bound, r.cumulative[i]));
  }
  py::dict d;
  d["buckets"] = buckets;
  d["sum"] = r.sum_seconds;
  d["count"] = r.count;
  return d;
}

py::dict BackendStatsToDict(const percolite::BackendStats& s) {
  py::dict d;
  d["commits"] = s.commits;
  d["conflicts"] = s.conflicts;
  d["batches"] = s.batches;
  d["inline_batches"] = s.inline_batches;
  d["tombstones_collected"] = s.tombstones_collected;
  d["map_size"] = s.map_size;
  d["map_growths"] = s.map_growths;
  if (!s.server.empty()) {  // a store on a server: its connection
    // The last event of a kind, or None when there was none.
    const auto last = [](uint64_t count, const char* name, const std::string& text,
                         double when) -> py::object {
      if (count == 0) return py::none();
      py::dict event;
      event[name] = text;
      event["unix"] = when;
      return std::move(event);
    };
    d["server"] = s.server;
    d["reconnections"] = s.reconnections;
    d["last_reconnection"] =
        last(s.reconnections, "cause", s.last_reconnection_cause, s.last_reconnection_unix);
    d["failovers"] = s.failovers;
    d["last_failover"] = last(s.failovers, "servers", s.last_failover, s.last_failover_unix);
    d["clock_offset_seconds"] = s.clock_offset_seconds;
    d["writer_busy_seconds"] = s.writer_busy_seconds;
    d["replication"] = s.replication;
    d["synchronous_standby_names"] = s.synchronous_standby_names;
    d["standbys"] = s.standbys;
  }
  return d;
}

void BindBegunRun(py::module_& m) {
  py::class_<PyBegunRun>(m, "BegunRun")
      .def_property_readonly("outcome",
                             [](const PyBegunRun& r) { return OutcomeName(r.run.outcome); })
      .def_property_readonly("row", [](const PyBegunRun& r) { return py::bytes(r.run.cell.row); })
      .def_property_readonly("family",
                             [](const PyBegunRun& r) { return py::bytes(r.run.cell.family); })
      .def_property_readonly("qualifier",
                             [](const PyBegunRun& r) { return py::bytes(r.run.cell.qualifier); })
      .def_property_readonly("observer", [](const PyBegunRun& r) { return r.run.observer; })
      .def_property_readonly(
          "cell_key", [](const PyBegunRun& r) { return py::bytes(r.run.notification.cell_key); })
      .def_property_readonly("error", [](const PyBegunRun& r) { return r.run.error; })
      .def_property_readonly("parked_keys",
                             [](const PyBegunRun& r) { return r.run.parked_keys->load(); })
      .def(
          "finish",
          [](PyBegunRun& r, bool conflict) {
            py::gil_scoped_release release;
            return std::string(OutcomeName(r.workers->FinishRun(r.run, conflict)));
          },
          py::arg("conflict") = false)
      .def("drop", [](PyBegunRun& r) {
        py::gil_scoped_release release;
        if (r.run.transaction) r.run.transaction->Abort();
        r.run.transaction.reset();
        r.run.outcome = percolite::RunOutcome::kGone;
      });
}

// Opening and closing a store, what it is, and its transactions.
void BindOpening(EnvClass& cls) {
  cls.def_static(
         "open",
         [](const std::string& path, const std::string& sync, bool create, unsigned mode,
            size_t map_size, unsigned max_readers, const std::string& backend, bool restored) {
           percolite::BackendOptions options;
           options.sync = ParseSync(sync);
           options.create = create;
           options.restored = restored;
           options.file_mode = mode;
           options.initial_map_size = map_size;
           options.max_readers = max_readers;
           auto env = std::make_unique<PyEnv>();
           py::gil_scoped_release release;
           env->env = percolite::Env::Open(path, options, backend);
           return env;
         },
         py::arg("path"), py::arg("sync"), py::arg("create"), py::arg("mode"), py::arg("map_size"),
         py::arg("max_readers"), py::arg("backend") = "", py::arg("restored") = false)
      .def("begin",
           [](PyEnv& self) {
             py::gil_scoped_release release;
             return self.env->Begin();
           })
      .def("close",
           [](PyEnv& self) {
             py::gil_scoped_release release;
             self.env->Close();
           })
      .def_property_readonly("closed", [](PyEnv& self) { return self.env->closed(); })
      .def_property_readonly("path", [](PyEnv& self) { return self.env->path(); })
      .def_property_readonly(
          "capabilities", [](PyEnv& self) { return CapabilitiesToDict(self.env->capabilities()); });
}

// The observers a store's notifications run: those of the bound app (queue
// processors among them), and the columns the store records.
void BindObservers(EnvClass& cls) {
  cls.def("set_observers",
          [](PyEnv& self, py::list specs) {
            std::vector<percolite::Observer> observers;
            for (py::handle spec : specs) observers.push_back(ObserverFromSpec(spec));
            py::gil_scoped_release release;
            self.env->SetObservers(std::move(observers));
          })
      .def("observed_columns", [](PyEnv& self) {
        return ListReleasingGil(
            [&] { return self.env->ObservedColumns(); },
            [](const percolite::ObservedColumn& c) {
              const char* kind = c.kind == percolite::NotifyKind::kStrong ? "strong" : "weak";
              return py::make_tuple(py::bytes(c.family), py::bytes(c.qualifier), kind, c.observer);
            });
      });
}

// This process's worker pool: started and stopped, waited for, its leases.
void BindWorkers(EnvClass& cls) {
  cls.def(
         "start_workers",
         [](PyEnv& self, int threads, int worker_index, int worker_count, double retry_initial,
            double retry_max, py::object on_failure, double lease_seconds,
            const std::string& lease_group, py::object on_lease_change, py::object on_recovery) {
           percolite::WorkerOptions options;
           options.on_lease_change = LeaseChangeCallback(std::move(on_lease_change));
           options.lease_seconds = lease_seconds;
           options.lease_group = lease_group;
           options.on_failure = RecordCallback(std::move(on_failure));
           options.on_recovery = RecordCallback(std::move(on_recovery));
           options.threads = threads;
           options.worker_index = worker_index;
           options.worker_count = worker_count;
           options.retry_initial_seconds = retry_initial;
           options.retry_max_seconds = retry_max;
           py::gil_scoped_release release;
           self.env->StartWorkers(options);
         },
         py::arg("threads"), py::arg("worker_index"), py::arg("worker_count"),
         py::arg("retry_initial"), py::arg("retry_max"), py::arg("on_failure") = py::none(),
         py::arg("lease_seconds") = percolite::kDefaultLeaseSeconds,
         py::arg("lease_group") = std::string(), py::arg("on_lease_change") = py::none(),
         py::arg("on_recovery") = py::none())
      .def("stop_workers",
           [](PyEnv& self) {
             py::gil_scoped_release release;
             self.env->StopWorkers();
           })
      .def("wait_idle",
           [](PyEnv& self, double timeout) {
             py::gil_scoped_release release;
             return self.env->WaitIdle(timeout);
           })
      .def("lease_holders", [](PyEnv& self) {
        return ListReleasingGil([&] { return self.env->LeaseHolders(); }, LeaseHolderToDict);
      });
}

// Running the pending work in the calling thread: all of it (run_here), or
// run by run, as a scheduler of the caller's picks them (runnable,
// begin_run, then BegunRun.finish).
void BindRunHere(EnvClass& cls) {
  cls.def(
         "run_here",
         [](PyEnv& self, uint64_t max_runs, bool stop_on_failure) {
           percolite::RunHereOptions options;
           options.max_runs = max_runs;
           options.stop_on_failure = stop_on_failure;
           percolite::RunHereSummary s;
           {
             py::gil_scoped_release release;
             s = self.env->RunHere(options);
           }
           return RunHereSummaryToDict(s);
         },
         py::arg("max_runs"), py::arg("stop_on_failure"))
      .def("runnable",
           [](PyEnv& self) {
             std::vector<percolite::Notification> found;
             {
               py::gil_scoped_release release;
               found = self.env->StepWorkers()->Runnable();
             }
             py::list out;
             for (const percolite::Notification& n : found) {
               percolite::Cell cell;
               percolite::DecodeCellKey(n.cell_key, &cell);  // Runnable decoded it already
               out.append(py::make_tuple(py::bytes(n.cell_key), n.row_hash, n.stamp,
                                         py::bytes(cell.family), py::bytes(cell.qualifier)));
             }
             return out;
           })
      .def(
          "begin_run",
          [](PyEnv& self, const std::string& cell_key, uint64_t row_hash, uint64_t stamp,
             bool fail) {
            auto begun = std::make_unique<PyBegunRun>();
            py::gil_scoped_release release;
            begun->workers = self.env->StepWorkers();
            begun->run =
                begun->workers->BeginRun(percolite::Notification{cell_key, stamp, row_hash},
                                         /*hurried=*/true, fail);
            return begun;
          },
          py::arg("cell_key"), py::arg("row_hash"), py::arg("stamp"), py::arg("fail") = false);
}

// The failure records every process shares (failures.h), and retrying
// parked work.
void BindFailures(EnvClass& cls) {
  cls.def(
         "work_records",
         [](PyEnv& self, bool parked_only) {
           return ListReleasingGil([&] { return self.env->WorkRecords(parked_only); },
                                   WorkRecordToDict);
         },
         py::arg("parked_only"))
      .def("failure_summaries",
           [](PyEnv& self) {
             return ListReleasingGil([&] { return self.env->FailureSummaries(); },
                                     FailureSummaryToDict);
           })
      .def(
          "retry_parked",
          [](PyEnv& self, std::optional<std::vector<std::string>> observers, bool refused_only,
             std::optional<py::tuple> cell, std::optional<py::bytes> key) {
            // One item: its cell (row, family, qualifier) and, for keyed work, its key.
            std::optional<std::string> cell_key;
            if (cell) {
              CellArg arg = ToCell((*cell)[0], py::make_tuple((*cell)[1], (*cell)[2]));
              cell_key = percolite::EncodeCellKey(arg.ref());
            }
            std::optional<std::string> wanted_key;
            if (key) wanted_key = std::string(*key);
            py::gil_scoped_release release;
            return self.env->RetryParked([&](const percolite::WorkRecord& r) {
              if (refused_only && r.sink != percolite::SinkFailure::kRefused) return false;
              if (cell_key && r.cell_key != *cell_key) return false;
              if (wanted_key && r.key != wanted_key) return false;
              return !observers || std::find(observers->begin(), observers->end(), r.observer) !=
                                       observers->end();
            });
          },
          py::arg("observers") = py::none(), py::arg("refused_only") = false,
          py::arg("cell") = py::none(), py::arg("key") = py::none());
}

// The pending notifications: counted, listed, and dropped by column.
void BindNotifications(EnvClass& cls) {
  cls.def("drop_notifications",
          [](PyEnv& self, const std::vector<std::pair<py::bytes, py::bytes>>& columns) {
            std::vector<std::pair<std::string, std::string>> wanted;
            for (const auto& [family, qualifier] : columns) {
              wanted.emplace_back(std::string(family), std::string(qualifier));
            }
            py::gil_scoped_release release;
            return self.env->DropNotifications(wanted);
          })
      .def("pending_notifications",
           [](PyEnv& self) {
             py::gil_scoped_release release;
             return self.env->backend()->PendingNotifications();
           })
      .def("pending_by_column",
           [](PyEnv& self) {
             std::map<std::pair<std::string, std::string>, uint64_t> counts;
             {
               py::gil_scoped_release release;
               counts = self.env->backend()->CountPendingByColumn();
             }
             py::dict out;
             for (const auto& [column, n] : counts) {
               out[py::make_tuple(py::bytes(column.first), py::bytes(column.second))] = n;
             }
             return out;
           })
      .def("scan_notifications", [](PyEnv& self, py::bytes after, size_t limit) {
        std::vector<percolite::Notification> found;
        std::string after_key = after;
        {
          py::gil_scoped_release release;
          self.env->backend()->ScanNotifications(after_key, limit, &found);
        }
        py::list out;
        for (const auto& n : found) {
          percolite::Cell cell;
          percolite::DecodeCellKey(n.cell_key, &cell);
          out.append(py::make_tuple(py::bytes(cell.row), py::bytes(cell.family),
                                    py::bytes(cell.qualifier), n.stamp,
                                    py::bytes(percolite::NotificationKey(n.row_hash, n.cell_key))));
        }
        return out;
      });
}

// The store's identity (identity.h) and the health of its structure.
void BindStoreChecks(EnvClass& cls) {
  cls.def(
         "identity",
         [](PyEnv& self, bool make) -> py::object {
           std::optional<percolite::StoreIdentity> identity;
           {
             py::gil_scoped_release release;
             if (make) self.env->MakeIdentity();
             identity = self.env->Identity();
           }
           if (!identity) return py::none();
           return py::make_tuple(identity->id, identity->epoch);
         },
         py::arg("make") = false)
      .def("verify_structure",
           [](PyEnv& self) {
             return ListReleasingGil([&] { return self.env->backend()->VerifyStructure(); },
                                     [](const std::string& problem) { return py::str(problem); });
           })
      .def("damaged_mark", [](PyEnv& self) -> std::optional<std::string> {
        py::gil_scoped_release release;
        return self.env->backend()->DamagedMark();
      });
}

// Counters for metrics and status: the worker pool's, the commits' latency,
// the backend's.
void BindMetrics(EnvClass& cls) {
  cls.def("worker_stats",
          [](PyEnv& self) {
            percolite::WorkerStats s;
            {
              py::gil_scoped_release release;
              s = self.env->GetWorkerStats();
            }
            return WorkerStatsToDict(s);
          })
      .def("commit_latency",
           [](PyEnv& self) {
             percolite::LatencyHistogram::Reading r;
             {
               py::gil_scoped_release release;
               r = self.env->backend()->commit_latency().Read();
             }
             return LatencyToDict(r);
           })
      .def("waiting_for_standbys",
           [](PyEnv& self) {
             percolite::Backend::StandbyWaits waits;
             {
               py::gil_scoped_release release;
               waits = self.env->WaitingForStandbys();
             }
             return py::dict(py::arg("sessions") = waits.sessions,
                             py::arg("longest_seconds") = waits.longest_seconds);
           })
      .def("stats", [](PyEnv& self) {
        percolite::BackendStats s;
        {
          py::gil_scoped_release release;
          s = self.env->Stats();
        }
        return BackendStatsToDict(s);
      });
}

}  // namespace

void BindEnv(py::module_& m) {
  BindBegunRun(m);
  EnvClass cls(m, "Env");
  BindOpening(cls);
  BindObservers(cls);
  BindWorkers(cls);
  BindRunHere(cls);
  BindFailures(cls);
  BindNotifications(cls);
  BindStoreChecks(cls);
  BindMetrics(cls);
}

}  // namespace percolite::bindings
