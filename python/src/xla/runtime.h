// libkreg_xla's process state: the registry, loaded once, and the (kernel,
// configuration) pairs the handlers run, parsed once each.
//
// Thread-safety: every function is thread-safe. The registry lives for the
// process, a Chosen as long as it is held.
#ifndef KREG_PYTHON_XLA_RUNTIME_H_
#define KREG_PYTHON_XLA_RUNTIME_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kreg/params.h"
#include "kreg/registry.h"

namespace kreg::xla {

// kreg's registry, as Registry::Load({}) finds plugins (KREG_PLUGIN_PATH,
// then beside kreg's library); the first load's error on every call if it
// failed.
absl::StatusOr<const Registry*> TheRegistry();

// A kernel and a parsed configuration of it.
struct Chosen {
  std::shared_ptr<const Kernel> kernel;
  Config config;
};

// `kernel` ("op/variant") with `config` (Kernel::ConfigString's "name=value
// ..."; "" for its defaults), parsed on first use and kept (up to
// kMaxChosen pairs, then forgotten at once). InvalidArgument for a kernel
// of another op than `op`.
absl::StatusOr<std::shared_ptr<const Chosen>> Choose(absl::string_view op, absl::string_view kernel,
                                                     absl::string_view config);
inline constexpr size_t kMaxChosen = 4096;

}  // namespace kreg::xla

#endif  // KREG_PYTHON_XLA_RUNTIME_H_
