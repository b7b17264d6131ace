// kreg.tune from Python (python/src/tune.cc).
#ifndef KREG_PYTHON_TUNE_H_
#define KREG_PYTHON_TUNE_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kreg/registry.h"

namespace kreg::python {

namespace py = pybind11;

struct PyRegistry {
  std::shared_ptr<const Registry> registry;
};

// {name: value} or "name=value,..." as NamedValues.
NamedValues NamedFromPython(const py::object& dims);

py::object Tune(PyRegistry& reg, const std::string& op, const py::object& dims_list, const std::string& db_path,
                const std::string& strategy, double budget, const py::object& reps, const py::object& warmup,
                const std::vector<std::string>& variants, const std::string& dtype, const std::string& with,
                const std::string& dist, uint64_t seed, const py::object& threads, double timeout,
                bool thread_round, const std::string& data_class, const std::string& device,
                const py::object& progress);

}  // namespace kreg::python

#endif  // KREG_PYTHON_TUNE_H_
