// transpose/reference: one element at a time, in x's order.
#include <cstring>

#include "common.h"

namespace kreg::transpose {
namespace {

kreg_status Run(const kreg_config*, const kreg_args* args, void*, void*, size_t, const kreg_host*, char*, size_t) {
  const View v = ViewOf(args);
  for (int64_t i = 0; i < v.rows; ++i) {
    for (int64_t j = 0; j < v.cols; ++j) {
      std::memcpy(v.out + (j * v.out_ld + i) * v.elem, v.x + (i * v.x_ld + j) * v.elem, v.elem);
    }
  }
  return KREG_OK;
}

}  // namespace

const kreg_kernel kReference = {
    .struct_size = sizeof(kreg_kernel),
    .op = "transpose",
    .variant = "reference",
    .version = 1,
    .doc = "one element at a time",
    .flags = KREG_KERNEL_REFERENCE,
    .run = Run,
};

}  // namespace kreg::transpose
