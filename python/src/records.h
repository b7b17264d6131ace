// kreg's records as Python dicts, built from the typed objects: the same
// fields, in the same order, as the command line's --json records (README,
// "--json"; tools/cli.h), so Python and `kreg query --json` / `kreg tune
// --json` / `kreg list --json` say the same thing. Strings are valid UTF-8;
// times are integer nanoseconds; dims and params are dicts.
#ifndef KREG_PYTHON_RECORDS_H_
#define KREG_PYTHON_RECORDS_H_

#include <pybind11/pybind11.h>

#include "absl/strings/string_view.h"
#include "kreg/answer.h"
#include "kreg/kreg_tuning.pb.h"
#include "kreg/params.h"
#include "kreg/registry.h"
#include "kreg/tuner.h"

namespace kreg::python {

namespace py = pybind11;

// {"method": "nth_element", "num_blocks": 128, "m_schedule": [5, 8]}.
py::dict ParamsDict(const tuning::Config& config);
py::dict ParamsDict(const Kernel& kernel, const Config& config);
// {"id", "model", "vendor", "arch", "uarch", "isa", "cores", "class"[, "gpu"]}.
py::dict MachineDict(const tuning::Machine& machine);
// This machine's MachineDict and the GPUs kreg's CUDA backend sees, as `kreg
// machine --json`: "gpus" [{"ordinal", "name", "sm", "sms", "memory_bytes",
// "driver"}], "gpus_why_none" (None where there are some).
py::dict ThisMachineDict();
// {"key", "kernel", "version", "params", "match", "incomplete", "tuned_dims",
// "distance", "median_ns", "machine", "why", "threads", "table"}.
py::dict AnswerDict(const QueryRecord& record);
// {"kernel", "op", "variant", "version", "doc", "isa", "device", "available",
// "why_unavailable", "reference", "plugin", "default_params", "space"}.
py::dict KernelDict(const PluginInfo& plugin, const Kernel& kernel);
// {"key", "best", "runner_up", "counts", "seconds", "strategy", "complete"}.
py::dict TuneResultDict(const TuneResult& result, absl::string_view strategy);

}  // namespace kreg::python

#endif  // KREG_PYTHON_RECORDS_H_
