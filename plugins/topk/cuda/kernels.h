// topk's CUDA device code (radix.cu, nvcc) as a plain launch the host side
// (plugin.cc) calls: no CUDA types cross this header.
#ifndef KREG_PLUGINS_TOPK_CUDA_KERNELS_H_
#define KREG_PLUGINS_TOPK_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "kreg/plugin_abi.h"

namespace kreg::cuda {

// topk/cuda_radix's call: device pointers, strides in elements.
struct RadixArgs {
  const void* input;  // [batch, n] f32 or bf16
  int64_t input_stride;
  const int32_t* row_starts;  // [batch] or nullptr
  int64_t starts_stride;
  const int32_t* row_ends;  // [batch] or nullptr
  int64_t ends_stride;
  void* values;  // [batch, k], the input's dtype
  int64_t values_stride;
  int32_t* indices;  // [batch, k]
  int64_t indices_stride;
  int32_t* stats;  // [batch] or nullptr
  int64_t stats_stride;
  int64_t batch, n;
  int k;
  bool largest, bf16;
  int bits;            // per radix round: 4 or 8
  int block;           // threads per block: 256, 512 or 1024
  int capacity;        // the candidate buffer (0: none; at most RadixMaxCapacity)
  int blocks_per_row;  // > 1: a row split between that many blocks
  int rows_per_block;  // > 1: a block takes that many rows in turn
};

// The largest k it sorts (on chip), and the largest candidate buffer.
int RadixMaxK();
int RadixMaxCapacity();
// Enqueues the top-k of every row on device's stream; non-zero with a
// reason in msg if a launch failed.
int LaunchRadixTopK(const RadixArgs& args, const kreg_device& device, char* msg, size_t cap);

}  // namespace kreg::cuda

#endif  // KREG_PLUGINS_TOPK_CUDA_KERNELS_H_
