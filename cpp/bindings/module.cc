// percolite._core: the module itself. bindings.h states the rules every
// binding follows; each class is bound in its own file.
#include <pybind11/pybind11.h>

#include <chrono>
#include <exception>
#include <string>
#include <string_view>

#include "bindings.h"
#include "errors.h"
#include "percolite/backend.h"
#include "percolite/combine_queue.h"
#include "percolite/env.h"
#include "percolite/export_queue.h"
#include "percolite/failures.h"
#include "percolite/leases.h"
#include "percolite/open_backend.h"
#include "percolite/pg_target.h"
#include "percolite/queue_limits.h"
#include "percolite/workers.h"

namespace py = pybind11;
namespace pb = percolite::bindings;

namespace {

// Targets, passwords and the names queue processors run under: rules the
// core owns, which Python asks for instead of restating.
void BindNames(py::module_& m) {
  {
    py::tuple names(percolite::BackendNames().size());
    size_t i = 0;
    for (const std::string& name : percolite::BackendNames()) names[i++] = name;
    m.attr("BACKENDS") = names;  // what percolite.open(..., backend=) accepts
  }
  m.def(
      "parse_target",
      [](const std::string& target, const std::string& backend) {
        const percolite::BackendTarget parsed = percolite::ParseTarget(target, backend);
        return py::make_tuple(parsed.backend, parsed.location);
      },
      py::arg("target"), py::arg("backend") = "",
      "(backend name, location) of a percolite.open target; ValueError naming what is wrong");
  m.def(
      "parse_postgresql_target",
      [](const std::string& target) {
        const percolite::PgTarget parsed = percolite::ParsePgTarget(target);
        return py::make_tuple(parsed.conninfo, parsed.schema, parsed.display);
      },
      py::arg("target"),
      "(libpq URI without percolite's parameters, schema, form to show with the password "
      "hidden) of a postgresql:// target; ValueError naming what is wrong");
  m.def(
      "postgresql_connect_defaults",
      [] {
        py::dict defaults;
        for (const auto& [name, value] : percolite::PgConnectDefaults())
          defaults[name.c_str()] = value;
        return defaults;
      },
      "{libpq keyword: value} percolite adds to a postgresql connection that leaves them out "
      "(connect_timeout, TCP keepalives, tcp_user_timeout): a vanished server is noticed in "
      "about 10 s");
  m.def(
      "hide_password", [](std::string_view text) { return percolite::HidePasswords(text); },
      py::arg("text"),
      "text with every password in it replaced by ***: a postgresql:// URI's user:PASSWORD@, a "
      "password= query parameter, libpq's key=value password=...; the rest as written");
  m.def(
      "processor_name",
      [](std::string_view kind, std::string_view queue_id) {
        return percolite::QueueProcessorName(kind, queue_id);
      },
      py::arg("kind"), py::arg("queue_id"),
      "the observer name the processor of queue queue_id runs under, kind 'combine queue' or "
      "'export queue' ('combine queue totals'); ValueError for another kind");
  m.def(
      "parse_processor_name",
      [](std::string_view name) -> py::object {
        const auto parsed = percolite::ParseQueueProcessorName(name);
        if (!parsed) return py::none();
        return py::make_tuple(parsed->first, parsed->second);
      },
      py::arg("name"),
      "(kind, queue id) of the queue whose processor runs under observer name `name`, kind "
      "'combine queue' or 'export queue'; None for any other name (only those two prefixes "
      "count: 'my queue x' is no queue's)");
  m.def(
      "packed_entries",
      [](py::bytes value) {
        py::list out;
        for (const auto& [key, entry] : percolite::PackedQueueEntries(std::string_view(value)))
          out.append(py::make_tuple(py::bytes(key), py::bytes(entry)));
        return out;
      },
      py::arg("value"),
      "the (key, value) entries of a packed queue record's value, in order; ValueError when it "
      "does not decode");
  m.def(
      "packed_count",
      [](py::bytes value) -> py::object {
        const auto count = percolite::PackedQueueCount(std::string_view(value));
        if (!count) return py::none();
        return py::int_(*count);
      },
      py::arg("value"),
      "the entry count in a packed queue record's header; None when the header does not decode");
}

void BindConstants(py::module_& m) {
  // ---- Constants: limits, layout facts and defaults of the core, which the
  // Python package reads from here instead of repeating them.
  m.attr("SEQ_INDEX_BITS") = percolite::kSeqIndexBits;
  m.attr("MAX_BUCKETS") = percolite::kMaxBuckets;
  m.attr("MAX_LINGER_SECONDS") = percolite::kMaxLingerSeconds;
  m.attr("QUEUE_KINDS") = py::make_tuple(percolite::kCombineQueueKind, percolite::kExportQueueKind);
  // Queued records: the stamp in front of a key, and the families of packed records.
  m.attr("STAMP_SIZE") = percolite::kStampSize;
  py::list packed;
  for (const std::string& family : percolite::PackedQueueFamilies())
    packed.append(py::bytes(family));
  m.attr("PACKED_FAMILIES") = py::tuple(packed);
  m.attr("NOTIFY_STRONG") = static_cast<int>(percolite::NotifyKind::kStrong);
  m.attr("NOTIFY_WEAK") = static_cast<int>(percolite::NotifyKind::kWeak);
  m.attr("SYNC_MODES") = py::make_tuple("full", "meta", "none");  // as ParseSync reads them
  m.attr("NATIVE_COMBINERS") = py::make_tuple("sum", "max", "min", "last");  // ParseCombiner's
  const percolite::BackendOptions backend;
  m.attr("DEFAULT_FILE_MODE") = backend.file_mode;
  m.attr("DEFAULT_MAP_SIZE") = backend.initial_map_size;
  m.attr("DEFAULT_MAX_READERS") = backend.max_readers;
  const percolite::WorkerOptions workers;
  m.attr("DEFAULT_THREADS") = workers.threads;
  m.attr("DEFAULT_RETRY_INITIAL") = workers.retry_initial_seconds;
  m.attr("DEFAULT_RETRY_MAX") = workers.retry_max_seconds;
  m.attr("DEFAULT_MAX_ATTEMPTS") = percolite::kDefaultMaxAttempts;
  m.attr("DEFAULT_LEASE_SECONDS") = percolite::kDefaultLeaseSeconds;
  m.attr("LEASE_PARTITIONS") = percolite::kLeasePartitions;
  m.attr("SYSTEM_ROW_PREFIX") = py::bytes(percolite::kSystemRowPrefix);
  m.attr("MAX_ATTEMPTS_LIMIT") = percolite::kMaxAttemptsLimit;
  // The scanner's pauses after a scan that found only known work (workers.h).
  m.attr("SCAN_PAUSE_FIRST") = std::chrono::duration<double>(percolite::kBusyRescan).count();
  m.attr("SCAN_PAUSE_MAX") = std::chrono::duration<double>(percolite::kScanBackoffMax).count();
  const percolite::CombineQueueOptions combine;
  m.attr("DEFAULT_COMBINE_BUCKETS") = combine.buckets;
  m.attr("DEFAULT_BUFFER_SIZE") = combine.buffer_size;
  m.attr("DEFAULT_BATCH_SIZE") = percolite::ExportQueueOptions().batch_size;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "percolite core (C++17 on LMDB). Use the 'percolite' package, not this module.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const percolite::Error& e) {
      pb::TranslateError(e);
    }
  });

  // A handle freed on a worker thread is closed by a thread of its own
  // (env.h), which releases Python callables and may run observers' last
  // runs: the interpreter waits for those threads before it finalizes, since
  // it ends a thread that takes the GIL then (pthread_exit, which aborts the
  // process when it unwinds a C++ destructor). Registered at import, so it
  // runs after percolite's own hook that closes the open handles (atexit
  // runs the last registered first), and waits for what their close frees.
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    py::gil_scoped_release release;
    percolite::Env::WaitForClosing();
  }));

  BindNames(m);

  // Order matters: a signature names a class bound earlier by its Python name
  // and a later one by its C++ name (Env.begin returns "percolite::Transaction"),
  // so this order keeps the docstrings as they are.
  pb::BindEnv(m);
  pb::BindCombineQueue(m);
  pb::BindExportQueue(m);
  pb::BindTransaction(m);
  pb::BindLoader(m);

  BindConstants(m);
}
