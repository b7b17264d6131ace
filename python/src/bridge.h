// The C entry a framework shim (python/src/torch) calls to run an op through
// a kreg.Dispatcher: the shim builds kreg_args over the framework's tensors
// and calls this, with no Python and no copy between. _kreg hands out its
// address and a Dispatcher's (Dispatcher._bridge()); a shim built against
// another library (libtorch) needs nothing of kreg's C++ but this and the
// plugin ABI.
#ifndef KREG_PYTHON_BRIDGE_H_
#define KREG_PYTHON_BRIDGE_H_

#include <stddef.h>
#include <stdint.h>

#include "kreg/plugin_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// What kreg_bridge_run returns.
enum {
  KREG_BRIDGE_OK = 0,
  KREG_BRIDGE_BAD_ARGUMENT = 1,  // ValueError
  KREG_BRIDGE_NO_MEMORY = 2,     // MemoryError
  KREG_BRIDGE_FAILED = 3         // RuntimeError
};

// Runs op `op` on `args` (host memory) with `threads` (0: all cores)
// through the kreg::Dispatcher at `dispatcher`; on failure writes kreg's
// one-line message into `error` (NUL-terminated, at most `error_cap`
// bytes). Thread-safe; takes no GIL.
typedef int (*kreg_bridge_run_fn)(const void* dispatcher, const char* op, const kreg_args* args, int32_t threads,
                                  char* error, size_t error_cap);

#ifdef __cplusplus
}
#endif

#endif  // KREG_PYTHON_BRIDGE_H_
