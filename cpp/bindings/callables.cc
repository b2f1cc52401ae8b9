#include "callables.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codecs.h"

namespace percolite::bindings {

bool InterpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

PyCallable::~PyCallable() {
  if (!Py_IsInitialized() || InterpreterFinalizing()) {
    fn.release();  // the interpreter is going away: leak rather than crash
    return;
  }
  py::gil_scoped_acquire gil;
  fn = py::object();
}

percolite::Status RunnerStatus(const py::tuple& outcome) {
  if (outcome[0].cast<bool>()) return percolite::Status::Ok();
  ErrorCode code = ErrorCode::kCallback;
  if (outcome.size() > 2 && !outcome[2].is_none()) {
    const std::string sink = outcome[2].cast<std::string>();
    code = sink == "refused" ? ErrorCode::kSinkRefused : ErrorCode::kSinkUnavailable;
  }
  return percolite::Status::Make(code, py::str(outcome[1]));
}

percolite::ObserverFn MakeObserverFn(py::object runner) {
  auto holder = std::make_shared<PyCallable>(std::move(runner));
  return [holder](const std::shared_ptr<percolite::Transaction>& tx, const percolite::Cell& cell) {
    return CallPython([&] {
      return RunnerStatus(
          holder->fn(tx, py::bytes(cell.row), py::bytes(cell.family), py::bytes(cell.qualifier)));
    });
  };
}

percolite::CombineFn MakeCombineFn(py::object runner) {
  auto holder = std::make_shared<PyCallable>(std::move(runner));
  return [holder](std::string_view key, const std::vector<std::string_view>& values,
                  std::optional<std::string>* result) {
    return CallPython([&] {
      py::list py_values(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        py_values[i] = py::bytes(values[i].data(), values[i].size());
      }
      py::tuple outcome = holder->fn(py::bytes(key.data(), key.size()), py_values);
      percolite::Status status = RunnerStatus(outcome);
      if (status.ok()) {
        py::object value = outcome[1];
        if (value.is_none()) {
          result->reset();
        } else {
          *result = value.cast<std::string>();
        }
      }
      return status;
    });
  };
}

percolite::ChangeFn MakeChangeFn(py::object runner) {
  auto holder = std::make_shared<PyCallable>(std::move(runner));
  return [holder](const std::shared_ptr<percolite::Transaction>& tx,
                  const std::vector<percolite::Change>& changes) {
    return CallPython([&] {
      py::list items(changes.size());
      for (size_t i = 0; i < changes.size(); ++i) {
        const auto& c = changes[i];
        items[i] = py::make_tuple(py::bytes(c.key),
                                  c.old_value ? py::object(py::bytes(*c.old_value)) : py::none(),
                                  c.new_value ? py::object(py::bytes(*c.new_value)) : py::none());
      }
      return RunnerStatus(holder->fn(tx, items));
    });
  };
}

percolite::ExportFn MakeExportFn(py::object runner, py::object entry_type, py::object key_codec,
                                 py::object value_codec) {
  auto holder = std::make_shared<PyCallable>(std::move(runner));
  std::optional<FastCodec> kc = ParseFastCodec(key_codec), vc = ParseFastCodec(value_codec);
  std::shared_ptr<PyCallable> type;
  if (kc && vc) {
    if (!PyType_Check(entry_type.ptr()) ||
        !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(entry_type.ptr()), &PyTuple_Type)) {
      throw py::type_error("the export entry type must be a tuple subclass");
    }
    type = std::make_shared<PyCallable>(std::move(entry_type));
  }
  return [holder, type, kc, vc](const std::vector<percolite::ExportEntry>& entries,
                                const percolite::StoreIdentity& store) {
    return CallPython([&] {
      py::list items(entries.size());
      for (size_t i = 0; i < entries.size(); ++i) {
        const auto& e = entries[i];
        items[i] =
            type ? DecodeExportEntry(reinterpret_cast<PyTypeObject*>(type->fn.ptr()), e, *kc, *vc)
                 : RawExportEntry(e);
      }
      return RunnerStatus(holder->fn(items, store.id, store.epoch));
    });
  };
}

}  // namespace percolite::bindings
