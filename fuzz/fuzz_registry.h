// The registry the fuzzers share: the build's own plugins (topk, gmm,
// collectives, and gmm_onednn where it was built), loaded once per process
// from KREG_FUZZ_PLUGIN_DIR — never from KREG_PLUGIN_PATH or an install, so
// a run sees the code it was built with.
//
// Thread-safety: FuzzRegistry() is thread-safe; the registry is immutable.
#ifndef KREG_FUZZ_FUZZ_REGISTRY_H_
#define KREG_FUZZ_FUZZ_REGISTRY_H_

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kreg/registry.h"

#ifndef KREG_FUZZ_PLUGIN_DIR
#error "KREG_FUZZ_PLUGIN_DIR must name the build's plugin folder"
#endif

namespace kreg::fuzz {

// Aborts (so the fuzzer fails at once, not after a minute of nothing) when
// the plugins cannot be loaded or define no op.
inline const Registry& FuzzRegistry() {
  static const Registry* const registry = [] {
    LoadOptions options;
    options.plugin_paths = {KREG_FUZZ_PLUGIN_DIR};
    options.use_env = false;
    options.use_default_dirs = false;
    absl::StatusOr<std::unique_ptr<Registry>> r = Registry::Load(options);
    if (!r.ok() || (*r)->Ops().empty()) {
      std::fprintf(stderr, "fuzz: no plugins loaded from %s: %s\n", KREG_FUZZ_PLUGIN_DIR,
                   r.ok() ? "no ops" : std::string(r.status().message()).c_str());
      std::abort();
    }
    for (const absl::Status& s : (*r)->refusals()) {
      std::fprintf(stderr, "fuzz: plugin refused: %s\n", std::string(s.message()).c_str());
    }
    return r->release();  // lives as long as the process
  }();
  return *registry;
}

// A property that must hold: a failure is a finding, reported as a crash
// with the input that caused it.
#define KREG_FUZZ_CHECK(cond)                                                                \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "fuzz: %s:%d: property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

// KREG_FUZZ_CHECK for a status: a failure prints its message too.
#define KREG_FUZZ_CHECK_OK(status_expr)                                                              \
  do {                                                                                               \
    const absl::Status kreg_fuzz_status = (status_expr);                                             \
    if (!kreg_fuzz_status.ok()) {                                                                    \
      std::fprintf(stderr, "fuzz: %s:%d: %s: %s\n", __FILE__, __LINE__, #status_expr,                \
                   kreg_fuzz_status.ToString().c_str());                                             \
      std::abort();                                                                                  \
    }                                                                                                \
  } while (0)

}  // namespace kreg::fuzz

#endif  // KREG_FUZZ_FUZZ_REGISTRY_H_
