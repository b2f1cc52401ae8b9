#include "percolite/export_queue.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "callables.h"

namespace percolite::bindings {

namespace {

// Threads of a simulation injecting exporter faults (_export.py): while
// there are any, every batch goes the exporter's Python way, where the
// faults are injected.
std::atomic<int> held_native_sinks{0};

percolite::SinkCell ParseCell(const std::string& name) {
  if (name == "text") return percolite::SinkCell::kText;
  if (name == "blob") return percolite::SinkCell::kBlob;
  if (name == "int64") return percolite::SinkCell::kInt64;
  if (name == "float64") return percolite::SinkCell::kFloat64;
  throw py::value_error("no sink cell '" + name + "'");
}

std::vector<percolite::SinkCell> ParseCells(const py::handle& names) {
  std::vector<percolite::SinkCell> cells;
  for (py::handle name : names) cells.push_back(ParseCell(name.cast<std::string>()));
  return cells;
}

// make(), a native sink; its kInvalidArgument as Python's ValueError.
template <typename Make>
std::shared_ptr<percolite::NativeSink> MadeOrValueError(Make make) {
  try {
    return make();
  } catch (const percolite::Error& e) {
    throw py::value_error(e.what());
  }
}

// The exporter's call, unless the native sink applies the batch itself.
percolite::ExportFn WithNativeSink(std::shared_ptr<percolite::NativeSink> sink,
                                   percolite::ExportFn exporter) {
  return [sink, exporter](const std::vector<percolite::ExportEntry>& entries,
                          const percolite::StoreIdentity& store) {
    if (held_native_sinks.load() == 0) {
      std::optional<percolite::Status> outcome = sink->Deliver(entries, store);
      if (outcome) return *outcome;
    }
    return exporter(entries, store);
  };
}

// The native sink of whatever built-in exporter a forwarding exporter names
// for this batch (ExportQueue._make_native_sink in _export.py): `choose`
// returns a NativeSink, or None when the exporter must take the batch. It
// is asked at every batch, with the GIL, since the exporter may name
// another sink later; the batch itself is applied without the GIL. A
// `choose` that raises leaves the batch to the exporter, which raises the
// same error its own way.
class ChosenNativeSink : public percolite::NativeSink {
 public:
  explicit ChosenNativeSink(py::object choose)
      : choose_(std::make_shared<PyCallable>(std::move(choose))) {}

  std::optional<percolite::Status> Deliver(const std::vector<percolite::ExportEntry>& entries,
                                           const percolite::StoreIdentity& store) override {
    std::shared_ptr<percolite::NativeSink> sink;
    percolite::Status chose = CallPython([&] {
      py::object chosen = choose_->fn();
      if (!chosen.is_none()) sink = chosen.cast<std::shared_ptr<percolite::NativeSink>>();
      return percolite::Status::Ok();
    });
    if (!chose.ok() || !sink || closed_.load()) {
      declined_.fetch_add(1);
      return std::nullopt;
    }
    std::optional<percolite::Status> outcome = sink->Deliver(entries, store);
    (outcome ? applied_ : declined_).fetch_add(1);
    return outcome;
  }
  void Close() override { closed_.store(true); }
  std::pair<uint64_t, uint64_t> Counters() const override {
    return {applied_.load(), declined_.load()};
  }

 private:
  const std::shared_ptr<PyCallable> choose_;
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> applied_{0}, declined_{0};
};

}  // namespace

void BindExportQueue(py::module_& m) {
  py::class_<percolite::NativeSink, std::shared_ptr<percolite::NativeSink>>(m, "NativeSink")
      .def("close", &percolite::NativeSink::Close, py::call_guard<py::gil_scoped_release>())
      // For tests and benchmarks: the sink alone, without a queue. None when
      // the exporter must take the batch, else (ok, error message, "down"
      // for an outage, else None), as the exporter runner returns.
      .def("deliver",
           [](percolite::NativeSink& self, const py::list& items, const std::string& store,
              uint64_t epoch) -> py::object {
             std::vector<percolite::ExportEntry> entries;
             entries.reserve(items.size());
             for (py::handle item : items) {
               auto t = item.cast<py::tuple>();
               entries.push_back(percolite::ExportEntry{
                   t[0].cast<std::string>(), t[1].cast<std::string>(), t[2].cast<uint64_t>()});
             }
             std::optional<percolite::Status> outcome;
             {
               py::gil_scoped_release release;
               outcome = self.Deliver(entries, percolite::StoreIdentity{store, epoch});
             }
             if (!outcome) return py::none();
             if (outcome->ok()) return py::make_tuple(true, py::none(), py::none());
             const bool down = outcome->code() == percolite::ErrorCode::kSinkUnavailable;
             return py::make_tuple(false, outcome->message(),
                                   down ? py::object(py::str("down")) : py::object(py::none()));
           })
      .def("counters", [](percolite::NativeSink& self) {
        auto [applied, declined] = self.Counters();
        return py::make_tuple(applied, declined);
      });
  m.def(
      "sqlite_sink",
      [](const py::dict& spec) {
        percolite::SqliteSinkOptions o;
        o.library = spec["library"].cast<std::string>();
        o.path = spec["path"].cast<std::string>();
        o.name = spec["name"].cast<std::string>();
        o.timeout_seconds = spec["timeout"].cast<double>();
        o.key_cells = ParseCells(spec["key_cells"]);
        o.value_cells = ParseCells(spec["value_cells"]);
        o.select_owner = spec["select_owner"].cast<std::string>();
        o.any_guard = spec["any_guard"].cast<std::string>();
        o.upsert = spec["upsert"].cast<std::string>();
        o.guard_seq = spec["guard_seq"].cast<std::string>();
        o.clear_guard = spec["clear_guard"].cast<std::string>();
        o.row_seq = spec["row_seq"].cast<std::string>();
        o.delete_row = spec["delete_row"].cast<std::string>();
        o.raise_guard = spec["raise_guard"].cast<std::string>();
        return MadeOrValueError([&] { return percolite::MakeSqliteSink(std::move(o)); });
      },
      py::arg("spec"));
  m.def(
      "postgres_sink",
      [](const py::dict& spec) {
        percolite::PostgresSinkOptions o;
        for (py::handle pair : spec["connect"]) {
          auto t = pair.cast<py::tuple>();
          o.connect.emplace_back(t[0].cast<std::string>(), t[1].cast<std::string>());
        }
        o.name = spec["name"].cast<std::string>();
        o.key_cells = ParseCells(spec["key_cells"]);
        o.value_cells = ParseCells(spec["value_cells"]);
        o.raise = spec["raise"].cast<std::string>();
        o.raise_unowned = spec["raise_unowned"].cast<std::string>();
        o.write = spec["write"].cast<std::string>();
        return MadeOrValueError([&] { return percolite::MakePostgresSink(std::move(o)); });
      },
      py::arg("spec"));
  m.def(
      "chosen_native_sink",
      [](py::object choose) -> std::shared_ptr<percolite::NativeSink> {
        return std::make_shared<ChosenNativeSink>(std::move(choose));
      },
      py::arg("choose"));
  m.def("hold_native_sinks", [](bool hold) { held_native_sinks.fetch_add(hold ? 1 : -1); });
  py::class_<percolite::ExportQueue, std::shared_ptr<percolite::ExportQueue>>(m, "ExportQueue")
      .def_static(
          "create",
          [](const std::string& id, uint32_t buckets, size_t batch_size, py::object exporter,
             py::object entry_type, py::object key_codec, py::object value_codec, double linger,
             uint32_t max_attempts, std::shared_ptr<percolite::NativeSink> native_sink) {
            percolite::ExportQueueOptions options;
            options.max_attempts = max_attempts;
            options.id = id;
            options.buckets = buckets;
            options.batch_size = batch_size;
            options.linger_seconds = linger;
            options.exporter = MakeExportFn(std::move(exporter), std::move(entry_type),
                                            std::move(key_codec), std::move(value_codec));
            if (native_sink) {
              options.exporter =
                  WithNativeSink(std::move(native_sink), std::move(options.exporter));
            }
            return percolite::ExportQueue::Create(std::move(options));
          },
          py::arg("id"), py::arg("buckets"), py::arg("batch_size"), py::arg("exporter"),
          py::arg("entry_type") = py::none(), py::arg("key_codec") = py::none(),
          py::arg("value_codec") = py::none(), py::arg("linger") = 0.0,
          py::arg("max_attempts") = percolite::kDefaultMaxAttempts,
          py::arg("native_sink") = nullptr)
      .def("add",
           [](percolite::ExportQueue& self, Tx& tx, py::bytes key, py::bytes value) {
             self.Add(tx, std::string(key), std::string(value));  // buffers only: keeps the GIL
           })
      .def("name_sink",
           [](percolite::ExportQueue& self, const std::string& sink) { self.NameSink(sink); })
      .def("counters",
           [](percolite::ExportQueue& self) {
             auto [batches, entries] = self.Counters();
             return py::make_tuple(batches, entries);
           })
      .def("bucket_of", [](percolite::ExportQueue& self,
                           py::bytes key) { return self.BucketOf(std::string(key)); })
      .def_property_readonly(
          "entry_row_prefix",
          [](percolite::ExportQueue& self) { return py::bytes(self.EntryRowPrefix()); })
      .def_property_readonly("notify_column", [](percolite::ExportQueue& self) {
        auto c = self.NotifyColumn();
        return py::make_tuple(py::bytes(c.family), py::bytes(c.qualifier), c.observer);
      });
}

}  // namespace percolite::bindings
