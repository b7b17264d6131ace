#include "kreg/text.h"

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "kreg/limits.h"

namespace kreg {
namespace {

// The length of the valid UTF-8 sequence starting at s[i], or 0.
size_t SequenceLength(absl::string_view s, size_t i) {
  const auto byte = [&](size_t j) { return static_cast<unsigned char>(s[j]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;  // no overlong forms
    if (c == 0xed) hi = 0x9f;  // no surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;  // <= U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t j = 2; j < n; ++j) {
    if (byte(i + j) < 0x80 || byte(i + j) > 0xbf) return 0;
  }
  return n;
}

}  // namespace

std::string ValidUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = SequenceLength(s, i);
    if (n == 0) {
      out += absl::StrFormat("\\x%02x", static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

std::string Printable(absl::string_view s) {
  const auto escape = [](std::string& out, absl::string_view bytes) {
    for (char c : bytes) out += absl::StrFormat("\\x%02x", static_cast<unsigned char>(c));
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = SequenceLength(s, i);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (n == 0 || c < 0x20 || c == 0x7f) {
      escape(out, s.substr(i, 1));  // not UTF-8, or a C0 control or DEL
    } else if (c == 0xc2 && static_cast<unsigned char>(s[i + 1]) < 0xa0) {
      escape(out, s.substr(i, 2));  // U+0080..U+009F: a C1 control (0x9b is CSI)
    } else {
      out.append(s.data() + i, n);
    }
    i += n == 0 ? 1 : n;
  }
  return out;
}

std::string OneLine(absl::string_view message) {
  std::string line = Printable(absl::StrReplaceAll(absl::StripTrailingAsciiWhitespace(message), {{"\n", "; "}}));
  if (line.size() <= static_cast<size_t>(limits::kMaxLineBytes)) return line;
  size_t cut = static_cast<size_t>(limits::kMaxLineBytes);
  while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xc0) == 0x80) --cut;  // not inside a character
  const size_t left = line.size() - cut;
  line.resize(cut);
  absl::StrAppend(&line, "... (", left, " more bytes)");
  return line;
}

}  // namespace kreg
