/* libkreg_xla: kreg's ops as XLA FFI custom calls (kreg.jax loads it with
 * ctypes and registers the handlers with jax.ffi.register_ffi_target).
 *
 * A C ABI, so the library is independent of the Python version: the
 * handlers speak XLA's FFI C API (xla/ffi/api/c_api.h, header-only). It
 * links kreg's registry and backends only (no tables: the kernel and its
 * configuration come as attributes, chosen at trace time by kreg's Python
 * module; a second copy of the tables' protobuf code in one process would
 * register its descriptors twice).
 *
 * Handlers (XLA_FFI_Handler*; CPU: host buffers, run in the calling thread,
 * the kernel's own oneTBB threads as kreg runs it):
 *   kreg_xla_topk_cpu   args  input [..., n] f32|bf16, then row_starts and
 *                             row_ends [...] i32 where has_row_starts /
 *                             has_row_ends say they are present;
 *                       rets  values [..., k] (input's dtype), indices
 *                             [..., k] i32. Leading dims fold into batch.
 *                       attrs kernel, config, threads, largest,
 *                             has_row_starts, has_row_ends.
 *   kreg_xla_gmm_cpu    args  lhs [m, k], rhs [lg, k, n] ([lg, n, k] with
 *                             transpose_rhs), group_sizes [groups] i32, then
 *                             existing_out [m, n] where has_existing_out;
 *                       rets  out [m, n].
 *                       attrs kernel, config, threads, transpose_rhs,
 *                             group_offset, has_existing_out.
 *   kreg_xla_tgmm_cpu   args  lhs [k, m], rhs [m, n], group_sizes;
 *                       rets  out [lg, k, n].
 *                       attrs kernel, config, threads, group_offset.
 *   kreg_xla_topk_cuda, kreg_xla_gmm_cuda, kreg_xla_tgmm_cuda
 *                       the same on CUDA: buffers on XLA's device, the
 *                       kernel (a CUDA one: the trace asks the tables for
 *                       the GPU) enqueued on XLA's stream through kreg's
 *                       CUDA backend, as kreg_bridge_run_on_stream does;
 *                       data on the device (group sizes, row ranges) is
 *                       not validated: the kernels clamp it. Built always
 *                       (they link no CUDA); without kreg's CUDA backend or
 *                       a GPU a call fails saying so.
 * `kernel` ("op/variant") and `config` (Kernel::ConfigString's "name=value
 * ...") are the tables' answer for the call's shape, asked at trace time; `threads` the
 * thread count the answer was measured fastest with (0: all). Integer
 * attributes are int64. A handler parses a (kernel, config) pair once and
 * keeps it; a call builds DLTensors over XLA's buffers (no copies) and runs
 * Kernel::Run, which validates the call first. An error is an FFI error
 * carrying kreg's one-line message (absl codes map to the FFI's).
 *
 * Thread-safety: every function may be called from any thread. The
 * registry (plugins found as kreg finds them: KREG_PLUGIN_PATH, then beside
 * libkreg_registry) is loaded on first use and kept for the process. */
#ifndef KREG_PYTHON_XLA_KREG_XLA_H_
#define KREG_PYTHON_XLA_KREG_XLA_H_

#include <stddef.h>

#include "xla/ffi/api/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KREG_XLA_EXPORT __attribute__((visibility("default")))

KREG_XLA_EXPORT XLA_FFI_Error* kreg_xla_topk_cpu(XLA_FFI_CallFrame* call_frame);
KREG_XLA_EXPORT XLA_FFI_Error* kreg_xla_gmm_cpu(XLA_FFI_CallFrame* call_frame);
KREG_XLA_EXPORT XLA_FFI_Error* kreg_xla_tgmm_cpu(XLA_FFI_CallFrame* call_frame);
KREG_XLA_EXPORT XLA_FFI_Error* kreg_xla_topk_cuda(XLA_FFI_CallFrame* call_frame);
KREG_XLA_EXPORT XLA_FFI_Error* kreg_xla_gmm_cuda(XLA_FFI_CallFrame* call_frame);
KREG_XLA_EXPORT XLA_FFI_Error* kreg_xla_tgmm_cuda(XLA_FFI_CallFrame* call_frame);

#ifdef __cplusplus
}
#endif

#endif /* KREG_PYTHON_XLA_KREG_XLA_H_ */
