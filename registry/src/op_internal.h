// What the Op's files share (op.cc, op_values.cc, op_args.cc), and the
// loader (registry.cc) with them. Private to the registry.
#ifndef KREG_REGISTRY_SRC_OP_INTERNAL_H_
#define KREG_REGISTRY_SRC_OP_INTERNAL_H_

#include "absl/strings/ascii.h"
#include "kreg/op.h"

namespace kreg {
namespace op_internal {

// Whether `s` is a name kreg takes: [a-z0-9_]+.
inline bool IsIdentifier(const char* s) {
  if (s == nullptr || *s == '\0') return false;
  for (; *s; ++s) {
    if (!absl::ascii_islower(*s) && !absl::ascii_isdigit(*s) && *s != '_') return false;
  }
  return true;
}

inline constexpr DType kAllTypes[] = {DType::kF32, DType::kBF16, DType::kI32};

}  // namespace op_internal
}  // namespace kreg

#endif  // KREG_REGISTRY_SRC_OP_INTERNAL_H_
