// Text that leaves kreg (tables, JSON, error lines) is valid UTF-8.
#ifndef KREG_REGISTRY_TEXT_H_
#define KREG_REGISTRY_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace kreg {

// `s` with every byte that is not part of a valid UTF-8 sequence written as
// the four characters \xHH; valid text comes back unchanged.
std::string ValidUtf8(absl::string_view s);

}  // namespace kreg

#endif  // KREG_REGISTRY_TEXT_H_
