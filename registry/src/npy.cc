#include "kreg/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "kreg/text.h"

namespace kreg {
namespace {

constexpr absl::string_view kMagic = "\x93NUMPY";
// Magic, version and a 4-byte header length: the most a preamble takes.
constexpr size_t kMaxPreamble = 12;
constexpr size_t kMaxHeader = size_t{1} << 20;
// How much text from the file an error quotes.
constexpr size_t kMaxQuote = 60;

absl::Status Bad(absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
}

// Text from the file, as an error may quote it: printable, on one line, and
// cut at kMaxQuote bytes (on a character boundary) with "..." appended.
std::string Quote(absl::string_view text) {
  if (text.size() <= kMaxQuote) return Printable(text);
  size_t cut = kMaxQuote;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  return absl::StrCat(Printable(text.substr(0, cut)), "...");
}

// What follows in the header, for "found ..." in an error.
std::string Found(absl::string_view rest) {
  rest = absl::StripTrailingAsciiWhitespace(rest);
  if (rest.empty()) return "the end of the header";
  return absl::StrCat("'", Quote(rest), "'");
}

// A shape as Python writes a tuple: "()", "(5,)", "(3, 4)".
std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), shape.size() == 1 ? ",)" : ")");
}

// What the header says about the array, and where its data starts.
struct Layout {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  size_t data_offset = 0;  // from the start of the file
  size_t data_bytes = 0;
};

// ---- The header: a Python dict literal, parsed strictly. ----
//
// The grammar accepted (what numpy writes, with the freedom Python's
// literal_eval gives in spacing, quotes and trailing commas):
//   header := [ \t]* '{' items? '}' space*
//   items  := item (',' item)* ','?
//   item   := string ':' value          (keys 'descr', 'fortran_order', 'shape')
//   string := '...' or "..." without backslashes or newlines
//   value  := string | True | False | '(' (int (',' int)* ','?)? ')'
// with `space` (space, tab, form feed, CR, LF) allowed around every token.
// A one-element tuple needs its comma, as in Python: (5) is the int 5.

// The whitespace Python allows between tokens inside brackets.
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\f' || c == '\r' || c == '\n'; }

void SkipSpace(absl::string_view& in) {
  while (!in.empty() && IsSpace(in.front())) in.remove_prefix(1);
}

// A quoted string at the front of `in` (consumed), without its quotes.
// `what` names it in errors ("a key", "'descr'").
absl::StatusOr<absl::string_view> ParseString(absl::string_view& in, absl::string_view what) {
  if (in.empty() || (in.front() != '\'' && in.front() != '"')) {
    return absl::InvalidArgumentError(absl::StrCat("header: ", what, " must be a quoted string, found ", Found(in)));
  }
  const char quote = in.front();
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i] == quote) {
      absl::string_view s = in.substr(1, i - 1);
      in.remove_prefix(i + 1);
      return s;
    }
    if (in[i] == '\\') {
      return absl::InvalidArgumentError(
          absl::StrCat("header: escape sequences in strings are not supported, found ", Found(in)));
    }
    if (in[i] == '\n') break;
  }
  return absl::InvalidArgumentError(absl::StrCat("header: unterminated string ", Found(in)));
}

// True or False at the front of `in` (consumed).
absl::StatusOr<bool> ParseBool(absl::string_view& in) {
  // The token: up to the next delimiter.
  size_t end = 0;
  while (end < in.size() && !IsSpace(in[end]) && in[end] != ',' && in[end] != '}') ++end;
  absl::string_view token = in.substr(0, end);
  if (token != "True" && token != "False") {
    return absl::InvalidArgumentError(
        absl::StrCat("header: 'fortran_order' must be True or False, found ", Found(token)));
  }
  in.remove_prefix(end);
  return token == "True";
}

// A tuple of non-negative ints at the front of `in` (consumed).
absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view& in) {
  if (in.empty() || in.front() != '(') {
    return absl::InvalidArgumentError(absl::StrCat("header: 'shape' must be a tuple, found ", Found(in)));
  }
  // The tuple's text, for errors: up to its ')', or, unclosed, up to the
  // dict's end.
  absl::string_view text = in.substr(0, in.find_first_of(")}"));
  if (text.size() < in.size() && in[text.size()] == ')') text = in.substr(0, text.size() + 1);
  const auto bad = [&](absl::string_view problem) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad shape '", Quote(absl::StripTrailingAsciiWhitespace(text)), "': ", problem));
  };
  in.remove_prefix(1);
  std::vector<int64_t> shape;
  bool comma = false;  // whether the last element had its comma
  while (true) {
    SkipSpace(in);
    if (in.empty() || in.front() == '}') return bad("unclosed tuple");
    if (in.front() == ')') break;
    if (in.front() == ',') return bad("empty element");
    if (!shape.empty() && !comma) return bad("expected ',' or ')' between dimensions");
    size_t end = 0;
    while (end < in.size() && !IsSpace(in[end]) && in[end] != ',' && in[end] != ')' && in[end] != '}') ++end;
    absl::string_view digits = in.substr(0, end);
    // A plain decimal, as Python writes one: no sign, no leading zeros.
    bool decimal = digits.size() == 1 || digits[0] != '0';
    for (char c : digits) decimal = decimal && c >= '0' && c <= '9';
    int64_t n = 0;
    if (!decimal) {
      return bad(absl::StrCat("'", Quote(digits), "' is not a non-negative integer"));
    }
    if (!absl::SimpleAtoi(digits, &n)) return bad(absl::StrCat("dimension ", Quote(digits), " is too large"));
    shape.push_back(n);
    in.remove_prefix(end);
    SkipSpace(in);
    comma = absl::ConsumePrefix(&in, ",");
  }
  in.remove_prefix(1);  // the ')'
  if (shape.size() == 1 && !comma) {
    return bad(absl::StrCat("not a tuple (write (", shape[0], ",) for one dimension)"));
  }
  return shape;
}

// The array's dtype from a descr string, or why kreg cannot read it.
absl::StatusOr<DType> DTypeOfDescr(absl::string_view descr) {
  const char order = descr.empty() ? '\0' : descr.front();
  absl::string_view type = descr;
  if (order == '<' || order == '>' || order == '|' || order == '=') type.remove_prefix(1);
  const bool known = type == "f4" || type == "i4" || type == "u2" || type == "i2";
  if (known && order != '<') {
    return absl::InvalidArgumentError(absl::StrCat("dtype '", Quote(descr),
                                                   "' is not supported: little-endian ('<') is required"));
  }
  if (descr == "<f4") return DType::kF32;
  if (descr == "<i4") return DType::kI32;
  if (descr == "<u2") return DType::kBF16;
  if (descr == "<i2") {
    return absl::InvalidArgumentError(
        "dtype '<i2' is not supported: bfloat16 data must be '<u2' (view the array as np.uint16)");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype '", Quote(descr), "' is not supported (use <f4, <i4, or <u2 holding bfloat16 bits)"));
}

// The header dict's text (without the preamble) into `layout`'s dtype and
// shape. Errors have no file name yet.
absl::Status ParseHeader(absl::string_view in, Layout& layout) {
  while (!in.empty() && (in.front() == ' ' || in.front() == '\t')) in.remove_prefix(1);
  if (!absl::ConsumePrefix(&in, "{")) {
    return absl::InvalidArgumentError(absl::StrCat("header is not a dict: found ", Found(in)));
  }
  std::optional<absl::string_view> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
  while (true) {
    SkipSpace(in);
    if (absl::ConsumePrefix(&in, "}")) break;
    absl::StatusOr<absl::string_view> key = ParseString(in, "a key");
    if (!key.ok()) return key.status();
    SkipSpace(in);
    if (!absl::ConsumePrefix(&in, ":")) {
      return absl::InvalidArgumentError(
          absl::StrCat("header: expected ':' after key '", Quote(*key), "', found ", Found(in)));
    }
    SkipSpace(in);
    const bool seen = *key == "descr" ? descr.has_value()
                      : *key == "fortran_order" ? fortran_order.has_value()
                      : *key == "shape" ? shape.has_value()
                                        : false;
    if (seen) return absl::InvalidArgumentError(absl::StrCat("header has key '", *key, "' twice"));
    if (*key == "descr") {
      if (!in.empty() && in.front() == '[') {
        return absl::InvalidArgumentError("header: 'descr' is a list: structured dtypes are not supported");
      }
      absl::StatusOr<absl::string_view> s = ParseString(in, "'descr'");
      if (!s.ok()) return s.status();
      descr = *s;
    } else if (*key == "fortran_order") {
      absl::StatusOr<bool> b = ParseBool(in);
      if (!b.ok()) return b.status();
      fortran_order = *b;
    } else if (*key == "shape") {
      absl::StatusOr<std::vector<int64_t>> s = ParseShape(in);
      if (!s.ok()) return s.status();
      shape = *std::move(s);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "header has unknown key '", Quote(*key), "' (expected 'descr', 'fortran_order' and 'shape')"));
    }
    SkipSpace(in);
    if (absl::ConsumePrefix(&in, "}")) break;
    if (!absl::ConsumePrefix(&in, ",")) {
      if (in.empty()) return absl::InvalidArgumentError("header: the dict is not closed");
      return absl::InvalidArgumentError(
          absl::StrCat("header: expected ',' or '}' after the value of '", *key, "', found ", Found(in)));
    }
  }
  // numpy pads the header with spaces and ends it with a newline.
  SkipSpace(in);
  if (!in.empty()) return absl::InvalidArgumentError(absl::StrCat("header has text after its dict: ", Found(in)));
  if (!descr) return absl::InvalidArgumentError("header has no 'descr'");
  if (!fortran_order) return absl::InvalidArgumentError("header has no 'fortran_order'");
  if (!shape) return absl::InvalidArgumentError("header has no 'shape'");

  absl::StatusOr<DType> dtype = DTypeOfDescr(*descr);
  if (!dtype.ok()) return dtype.status();
  if (*fortran_order) return absl::InvalidArgumentError("Fortran-order arrays are not supported");
  layout.dtype = *dtype;
  layout.shape = *std::move(shape);
  return absl::OkStatus();
}

// Where the header lies: file[start, end).
struct HeaderSpan {
  size_t start = 0;
  size_t end = 0;
};

// The preamble at the front of `file` (which may hold just the preamble):
// where the header lies. The header itself is not looked at.
absl::StatusOr<HeaderSpan> ParsePreamble(absl::string_view file, absl::string_view name) {
  if (file.size() < 8 || file.substr(0, 6) != kMagic) return Bad(name, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(file[6]), minor = static_cast<unsigned char>(file[7]);
  const auto byte = [&](size_t i) { return static_cast<size_t>(static_cast<unsigned char>(file[i])); };
  HeaderSpan span;
  size_t header_len = 0;
  if (major == 1 && minor == 0) {
    span.start = 10;  // a 2-byte length
    if (file.size() < span.start) return Bad(name, "truncated header");
    header_len = byte(8) | byte(9) << 8;
  } else if ((major == 2 || major == 3) && minor == 0) {
    span.start = 12;  // a 4-byte length
    if (file.size() < span.start) return Bad(name, "truncated header");
    header_len = byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24;
  } else {
    return Bad(name, absl::StrCat("unsupported .npy format version ", major, ".", minor));
  }
  if (header_len > kMaxHeader) return Bad(name, absl::StrCat("header too long (", header_len, " bytes)"));
  span.end = span.start + header_len;
  return span;
}

// The preamble and header at the front of `file` (which may stop anywhere
// after them) as a Layout.
absl::StatusOr<Layout> ParseLayout(absl::string_view file, absl::string_view name) {
  absl::StatusOr<HeaderSpan> span = ParsePreamble(file, name);
  if (!span.ok()) return span.status();
  if (file.size() < span->end) return Bad(name, "truncated header");
  Layout layout;
  if (absl::Status s = ParseHeader(file.substr(span->start, span->end - span->start), layout); !s.ok()) {
    return Bad(name, s.message());
  }
  layout.data_offset = span->end;
  absl::StatusOr<size_t> bytes = CheckedBytes(layout.dtype, layout.shape);
  if (!bytes.ok()) return Bad(name, absl::StrCat("shape ", ShapeText(layout.shape), " is too large"));
  layout.data_bytes = *bytes;
  return layout;
}

absl::Status Truncated(absl::string_view name, const Layout& layout, size_t available) {
  return Bad(name, absl::StrCat("truncated data: expected ", layout.data_bytes, " bytes for shape ",
                                ShapeText(layout.shape), ", found ", available));
}

// Reads up to `n` bytes at the file's current offset into `out`; returns
// how many it read (fewer at the end of the file), or -1 with errno set.
ssize_t ReadFully(int fd, char* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = read(fd, out + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return static_cast<ssize_t>(done);
}

// Closes a file descriptor when it goes out of scope.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

absl::StatusOr<Tensor> ParseNpy(absl::string_view bytes, absl::string_view name) {
  absl::StatusOr<Layout> layout = ParseLayout(bytes, name);
  if (!layout.ok()) return layout.status();
  const size_t available = bytes.size() - layout->data_offset;
  if (available < layout->data_bytes) return Truncated(name, *layout, available);
  absl::StatusOr<Tensor> t = Tensor::Make(layout->dtype, layout->shape);
  if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(name, ": ", t.status().message()));
  if (t->nbytes() > 0) std::memcpy(t->data(), bytes.data() + layout->data_offset, t->nbytes());
  return t;
}

absl::StatusOr<Tensor> ReadNpy(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused
  // below as not a regular file.
  Fd file{open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (file.fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open file"));
  struct stat st;
  if (fstat(file.fd, &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot stat file"));
  if (!S_ISREG(st.st_mode)) return Bad(path, "not a regular file");
  const auto read_error = [&] { return absl::ErrnoToStatus(errno, absl::StrCat(path, ": read failed")); };

  // The preamble, then the header it announces, then the data straight into
  // the tensor (so a large array is not held twice).
  std::string head(kMaxPreamble, '\0');
  ssize_t got = ReadFully(file.fd, head.data(), head.size());
  if (got < 0) return read_error();
  head.resize(static_cast<size_t>(got));
  absl::StatusOr<HeaderSpan> span = ParsePreamble(head, path);
  if (!span.ok()) return span.status();
  if (span->end > head.size()) {
    const size_t had = head.size();
    head.resize(span->end);
    got = ReadFully(file.fd, head.data() + had, span->end - had);
    if (got < 0) return read_error();
    head.resize(had + static_cast<size_t>(got));
  }
  absl::StatusOr<Layout> layout = ParseLayout(head, path);
  if (!layout.ok()) return layout.status();
  // Bytes already read past the header (a preamble-sized header's data).
  absl::string_view extra = absl::string_view(head).substr(layout->data_offset);
  const size_t size = static_cast<size_t>(st.st_size);
  const size_t available = size > layout->data_offset ? size - layout->data_offset : 0;
  if (available < layout->data_bytes) return Truncated(path, *layout, available);
  absl::StatusOr<Tensor> made = Tensor::Make(layout->dtype, layout->shape);
  if (!made.ok()) return absl::Status(made.status().code(), absl::StrCat(path, ": ", made.status().message()));
  Tensor& t = *made;
  char* data = static_cast<char*>(t.data());
  const size_t from_head = std::min(extra.size(), t.nbytes());
  if (from_head > 0) std::memcpy(data, extra.data(), from_head);
  got = ReadFully(file.fd, data + from_head, t.nbytes() - from_head);
  if (got < 0) return read_error();
  if (from_head + static_cast<size_t>(got) < t.nbytes()) {
    return Truncated(path, *layout, from_head + static_cast<size_t>(got));  // the file shrank
  }
  return made;
}

absl::Status WriteNpy(const std::string& path, const Tensor& t) {
  absl::string_view descr = t.dtype() == DType::kF32   ? "<f4"
                           : t.dtype() == DType::kI32 ? "<i4"
                                                      : "<u2";
  std::string shape = absl::StrJoin(t.shape(), ", ");
  if (t.shape().size() == 1) absl::StrAppend(&shape, ",");
  std::string header = absl::StrCat("{'descr': '", descr,
                                    "', 'fortran_order': False, 'shape': (",
                                    shape, "), }");
  // Pad with spaces so that data starts on a 64-byte boundary, end with \n.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write file"));
  out.write(kMagic.data(), kMagic.size());
  const char version[2] = {1, 0};
  out.write(version, 2);
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                static_cast<unsigned char>(header.size() >> 8)};
  out.write(reinterpret_cast<const char*>(len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace kreg
