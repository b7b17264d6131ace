#include "kreg/npy.h"

#include <cstdio>
#include <fstream>
#include "absl/strings/string_view.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kreg {
namespace {

constexpr absl::string_view kMagic = "\x93NUMPY";

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// Finds `'key':` in a header dict and returns the text after it.
bool FindKey(absl::string_view header, absl::string_view key,
             absl::string_view* rest) {
  size_t at = header.find(absl::StrCat("'", key, "'"));
  if (at == absl::string_view::npos) return false;
  size_t colon = header.find(':', at);
  if (colon == absl::string_view::npos) return false;
  *rest = absl::StripLeadingAsciiWhitespace(header.substr(colon + 1));
  return true;
}

}  // namespace

absl::StatusOr<Tensor> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  char preamble[8];
  if (!in.read(preamble, 8) || absl::string_view(preamble, 6) != kMagic) {
    return Bad(path, "not a .npy file (bad magic)");
  }
  int major = static_cast<unsigned char>(preamble[6]);
  size_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) return Bad(path, "truncated header");
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) return Bad(path, "truncated header");
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<size_t>(b[3]) << 24);
  } else {
    return Bad(path, absl::StrCat("unsupported .npy format version ", major));
  }
  if (header_len > (1u << 20)) return Bad(path, "header too long");
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) return Bad(path, "truncated header");

  absl::string_view v;
  if (!FindKey(header, "descr", &v) || v.size() < 5 || v[0] != '\'') {
    return Bad(path, "header has no 'descr'");
  }
  absl::string_view descr = v.substr(1, v.find('\'', 1) - 1);
  DType dtype;
  if (descr == "<f4") {
    dtype = DType::kF32;
  } else if (descr == "<u2" || descr == "<i2") {
    dtype = DType::kBF16;
  } else if (descr == "<i4") {
    dtype = DType::kI32;
  } else {
    return Bad(path, absl::StrCat("dtype '", descr,
                                  "' is not supported (use <f4, <i4, or <u2 "
                                  "holding bfloat16 bits)"));
  }
  if (!FindKey(header, "fortran_order", &v)) return Bad(path, "header has no 'fortran_order'");
  if (absl::StartsWith(v, "True")) return Bad(path, "Fortran-order arrays are not supported");
  if (!FindKey(header, "shape", &v) || v.empty() || v[0] != '(') {
    return Bad(path, "header has no 'shape'");
  }
  absl::string_view dims = v.substr(1, v.find(')') - 1);
  std::vector<int64_t> shape;
  for (absl::string_view d : absl::StrSplit(dims, ',', absl::SkipWhitespace())) {
    int64_t n;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &n) || n < 0) {
      return Bad(path, absl::StrCat("bad shape '(", dims, ")'"));
    }
    shape.push_back(n);
  }
  absl::StatusOr<size_t> bytes = CheckedBytes(dtype, shape);
  if (!bytes.ok()) return Bad(path, absl::StrCat("shape (", dims, ") is too large"));
  const std::streampos data_start = in.tellg();
  in.seekg(0, std::ios::end);
  const std::streamoff available = in.tellg() - data_start;
  in.seekg(data_start);
  if (available < 0 || static_cast<size_t>(available) < *bytes) {
    return Bad(path, absl::StrCat("truncated data: expected ", *bytes, " bytes for shape (", dims, "), found ",
                                  available < 0 ? 0 : available));
  }
  Tensor t(dtype, shape);
  if (!in.read(static_cast<char*>(t.data()), static_cast<std::streamsize>(t.nbytes()))) {
    return Bad(path, absl::StrCat("truncated data: expected ", t.nbytes(),
                                  " bytes for shape ", t.ShapeString()));
  }
  return t;
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
