// The C entries a framework shim (python/src/torch) calls to run an op through
// a kreg.Dispatcher: the shim builds kreg_args over the framework's tensors
// (host ones, or CUDA ones on the framework's stream) and calls these, with
// no Python and no copy between. _kreg hands out its
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

// Runs op `op` on `args` whose tensors are in the memory of CUDA device
// `device_ordinal` (DLTensor.device kDLCUDA) on the caller's `stream` (a
// cudaStream_t of that device; 0 the legacy default stream): the Dispatcher
// asks the table for that GPU, and its CUDA kernel is enqueued on `stream`
// after the caller's work there; nothing is synchronised, so the caller
// orders what reads the outputs on the same stream. Data the host cannot
// read without waiting (group sizes, row ranges) is not validated: the
// kernels clamp it. Errors as kreg_bridge_run's. Thread-safe; takes no GIL.
typedef int (*kreg_bridge_run_on_stream_fn)(const void* dispatcher, const char* op, const kreg_args* args,
                                            int32_t device_ordinal, void* stream, char* error, size_t error_cap);

#ifdef __cplusplus
}
#endif

#endif  // KREG_PYTHON_BRIDGE_H_
