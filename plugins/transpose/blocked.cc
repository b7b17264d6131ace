// transpose/blocked: tile x tile blocks, each read row by row and written
// column by column while both fit in L1, the blocks spread over oneTBB's
// threads (the host's arena). `tile` is the tuned parameter.
#include <algorithm>
#include <atomic>
#include <cstring>

#include <oneapi/tbb/blocked_range2d.h>
#include <oneapi/tbb/parallel_for.h>

#include "common.h"

namespace kreg::transpose {
namespace {

const int64_t kTiles[] = {8, 16, 32, 64, 128};
const kreg_param_desc kTileParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "tile",
    .doc = "rows and columns of a block",
    .kind = KREG_PARAM_INT,
    .values = kTiles,
    .num_values = sizeof kTiles / sizeof kTiles[0],
    .default_value = 32,
};
const kreg_param_desc* const kParams[] = {&kTileParam};

template <typename T>
void Block(const View& v, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const T* x = reinterpret_cast<const T*>(v.x);
  T* out = reinterpret_cast<T*>(v.out);
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j = j0; j < j1; ++j) out[j * v.out_ld + i] = x[i * v.x_ld + j];
  }
}

template <typename T>
kreg_status Tiled(const View& v, int64_t tile, const kreg_host* host) {
  std::atomic<bool> stop{false};
  tbb::parallel_for(tbb::blocked_range2d<int64_t>(0, v.rows, tile, 0, v.cols, tile),
                    [&](const tbb::blocked_range2d<int64_t>& r) {
                      if (stop.load(std::memory_order_relaxed)) return;
                      if (sdk::Cancelled(host)) {
                        stop = true;
                        return;
                      }
                      for (int64_t i = r.rows().begin(); i < r.rows().end(); i += tile) {
                        for (int64_t j = r.cols().begin(); j < r.cols().end(); j += tile) {
                          Block<T>(v, i, std::min(i + tile, r.rows().end()), j, std::min(j + tile, r.cols().end()));
                        }
                      }
                    });
  return stop ? KREG_CANCELLED : KREG_OK;
}

kreg_status Run(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                char* msg, size_t cap) {
  return sdk::Guarded(msg, cap, [&] {
    const View v = ViewOf(args);
    const int64_t tile = config->values[0]->value;
    const kreg_status s = v.elem == 2 ? Tiled<uint16_t>(v, tile, host) : Tiled<uint32_t>(v, tile, host);
    return sdk::Finish(s, msg, cap);
  });
}

}  // namespace

const kreg_kernel kBlocked = {
    .struct_size = sizeof(kreg_kernel),
    .op = "transpose",
    .variant = "blocked",
    .version = 1,
    .doc = "tile x tile blocks in parallel",
    .params = kParams,
    .num_params = 1,
    .run = Run,
};

}  // namespace kreg::transpose
