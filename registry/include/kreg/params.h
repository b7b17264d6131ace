// Kernel parameters: their descriptors as the host reads them, the values
// they may take, configurations, and how both are written and parsed. The
// one place that knows parameter values: the registry, the tuner, the table
// and the command line all ask here.
//
// A ParamInfo is a copy of a plugin's kreg_param_desc made once at load time,
// reading only the fields its struct_size covers (the ABI's growth rule), so
// nothing else in the host touches a raw descriptor. Value types; const
// methods are thread-safe.
#ifndef KREG_REGISTRY_PARAMS_H_
#define KREG_REGISTRY_PARAMS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/plugin_abi.h"

namespace kreg {

// One parameter value; see kreg_param_value.
struct ParamValue {
  int64_t value = 0;         // INT: the value; CHOICE: the index
  std::vector<int64_t> list;  // INT_LIST
  auto operator<=>(const ParamValue&) const = default;
};

struct ParamInfo {
  std::string name, doc;
  kreg_param_kind kind = KREG_PARAM_INT;
  kreg_values_kind values_kind = KREG_VALUES_LISTED;
  std::vector<int64_t> listed;  // LISTED values, as declared
  int64_t lo = 0, hi = 0, step = 1;
  int cap_dim = -1;  // index into the op's dims, or -1
  std::vector<std::string> choices;
  std::vector<uint32_t> choice_isa;  // per choice; empty: none need any
  ParamValue default_value;          // as declared (see Kernel::DefaultConfig)
  int when_param = -1;               // index of the controlling parameter, or -1
  std::vector<int64_t> when_values;

  // The values an INT parameter or INT_LIST element may take, increasing.
  // With `dims` (the op's dims of a problem) generated values are capped at
  // cap_dim's value; without, they are not.
  std::vector<int64_t> Values(const int64_t* dims = nullptr) const;
  // Whether `v` is one of Values(dims), without building the list.
  bool Legal(int64_t v, const int64_t* dims = nullptr) const;
  // Whether choice `i` exists and the CPU (`isa`) has what it needs.
  bool ChoiceAvailable(int64_t i, uint32_t isa) const;
};

// A parameter's values for people: "{a,b(n/a)}" (choices, those this CPU
// cannot run marked), "{1,2,4}", "powers of two in [1..64]", "[1..9 step 2]".
std::string ParamValuesText(const ParamInfo& p);
// "int", "int_list" or "choice".
const char* ParamTypeName(const ParamInfo& p);

// Copies `desc` (reading only fields its struct_size covers) and checks it:
// InvalidArgument naming the problem. `dims` are the op's dim names, for
// cap_dim; `earlier` the parameters before it, for when_param.
absl::StatusOr<ParamInfo> ReadParam(const kreg_param_desc& desc, const std::vector<std::string>& dims,
                                    const std::vector<ParamInfo>& earlier);

// A configuration of a kernel: one value per parameter, in order. A value
// type.
class Config {
 public:
  Config() = default;
  explicit Config(std::vector<ParamValue> values) : values_(std::move(values)) {}
  const std::vector<ParamValue>& values() const { return values_; }
  std::vector<ParamValue>& mutable_values() { return values_; }
  bool operator==(const Config& o) const { return values_ == o.values_; }

  // The ABI view of a Config; valid while both it and the Config live and
  // the Config is unchanged.
  class AbiView {
   public:
    explicit AbiView(const Config& config);
    AbiView(const AbiView&) = delete;
    AbiView& operator=(const AbiView&) = delete;
    const kreg_config* get() const { return &config_; }

   private:
    absl::InlinedVector<kreg_param_value, 8> values_;  // inline: checks make one per call
    absl::InlinedVector<const kreg_param_value*, 8> pointers_;
    kreg_config config_;
  };

 private:
  std::vector<ParamValue> values_;
};

// A kernel's parameters, as one space.
class ParamSpace {
 public:
  ParamSpace() = default;
  explicit ParamSpace(std::vector<ParamInfo> params) : params_(std::move(params)) {}
  const std::vector<ParamInfo>& params() const { return params_; }
  size_t size() const { return params_.size(); }
  const ParamInfo& operator[](size_t i) const { return params_[i]; }
  int Find(absl::string_view name) const;  // -1 if none

  // The declared defaults, with a CHOICE whose default the CPU lacks moved
  // to its first available choice.
  Config Default(uint32_t isa) const;
  // Whether parameter i is active under `config` (its when-condition holds).
  bool Active(const Config& config, size_t i) const;
  // OK when every value is one its parameter may take (with `dims`, capped
  // at them), lists increase, choices exist and the CPU has their ISA, and
  // inactive parameters hold their defaults. InvalidArgument naming the
  // parameter otherwise. `kernel` names the kernel in messages.
  absl::Status Validate(const Config& config, absl::string_view kernel, uint32_t isa,
                        const int64_t* dims = nullptr) const;

  // Parses NAME=VALUE overrides onto Default(isa): an integer, a list of
  // integers (comma- or colon-separated), or a choice name. Checked as
  // Validate does (without dims).
  absl::StatusOr<Config> Parse(const std::vector<std::pair<std::string, std::string>>& overrides,
                               absl::string_view kernel, uint32_t isa) const;
  // (name, value) of each parameter, values as Parse reads them.
  std::vector<std::pair<std::string, std::string>> Pairs(const Config& config) const;
  // "num_blocks=128 m_schedule=5,8,64"; "" for no parameters.
  std::string Format(const Config& config) const;

  // Every configuration, as the tuner searches them: the product over
  // active parameters of their values (capped at `dims` when given);
  // choices the CPU lacks left out; inactive parameters at their defaults;
  // list parameters as the increasing lists of 1..max_list_len values plus
  // the default list. The default configuration comes first. Legality
  // against a problem is the kernel's check, asked by the caller.
  std::vector<Config> Enumerate(uint32_t isa, const int64_t* dims, int max_list_len) const;

 private:
  std::vector<ParamInfo> params_;
};

}  // namespace kreg

#endif  // KREG_REGISTRY_PARAMS_H_
