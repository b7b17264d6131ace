// Text that leaves kreg (tables, JSON, error lines) is valid UTF-8, and text
// quoted in an error line is also printable. Plain functions, thread-safe.
#ifndef KREG_REGISTRY_TEXT_H_
#define KREG_REGISTRY_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace kreg {

// `s` with every byte that is not part of a valid UTF-8 sequence written as
// the four characters \xHH; valid text comes back unchanged.
std::string ValidUtf8(absl::string_view s);

// `s` made safe to print on one terminal line: control characters (bytes
// below 0x20, 0x7f, and the C1 controls U+0080..U+009F, byte by byte) and
// bytes that are not valid UTF-8 written as \xHH; newline, tab and carriage
// return as \n, \t and \r. A backslash stays as it is, and valid printable
// UTF-8 comes back unchanged.
std::string Printable(absl::string_view s);

// `message` as one line of an error or warning: its lines joined by "; ",
// then Printable, and cut to limits::kMaxLineBytes (on a character
// boundary, saying how much was left out): text from a plugin, a table or a
// flag can neither break the line, drive the terminal nor flood it.
std::string OneLine(absl::string_view message);

}  // namespace kreg

#endif  // KREG_REGISTRY_TEXT_H_
