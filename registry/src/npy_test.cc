#include "kreg/npy.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/problem.h"
#include "kreg/text.h"

namespace kreg {
namespace {

using ::testing::HasSubstr;

std::string Path(const std::string& name) { return ::testing::TempDir() + "/npy_test_" + name; }

TEST(NpyTest, RoundTripsEveryDtypeAndRank) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI32}) {
    for (std::vector<int64_t> shape : std::vector<std::vector<int64_t>>{{7}, {3, 5}, {0, 4}, {2, 3, 4}}) {
      Tensor t(dtype, shape);
      FillRandom(t, Dist::kBits, 5);
      ASSERT_TRUE(WriteNpy(Path("rt.npy"), t).ok());
      absl::StatusOr<Tensor> back = ReadNpy(Path("rt.npy"));
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->dtype(), dtype);
      EXPECT_EQ(back->shape(), shape);
      EXPECT_EQ(std::memcmp(back->data(), t.data(), t.nbytes()), 0);
    }
  }
}

// Tensor::Make is how the library makes a tensor: a status, never an
// exception, for a negative dimension, a size that overflows or memory that
// runs out.
TEST(TensorTest, MakeReturnsAStatusWhereTheConstructorWouldThrow) {
  absl::StatusOr<Tensor> t = Tensor::Make(DType::kBF16, {3, 5});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nbytes(), 30u);
  EXPECT_EQ(t->GuardDamage(), 0u);
  for (int64_t i = 0; i < t->numel(); ++i) EXPECT_EQ(t->GetAsDouble(i), 0.0);
  EXPECT_EQ(t->dl()->shape[1], 5);
  absl::StatusOr<Tensor> negative = Tensor::Make(DType::kF32, {2, -1});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(negative.status().message()), HasSubstr("[2, -1]"));
  absl::StatusOr<Tensor> overflow = Tensor::Make(DType::kF32, {int64_t{1} << 40, int64_t{1} << 40});
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument);
  // A size that fits size_t but no machine's memory (1 PiB).
  absl::StatusOr<Tensor> huge = Tensor::Make(DType::kF32, {int64_t{1} << 48});
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("cannot allocate"));
  EXPECT_THROW(Tensor(DType::kF32, {int64_t{1} << 48}), std::bad_alloc);
}

TEST(NpyTest, DataIsAlignedTo64Bytes) {
  Tensor t(DType::kF32, {2, 2});
  ASSERT_TRUE(WriteNpy(Path("align.npy"), t).ok());
  EXPECT_EQ(std::filesystem::file_size(Path("align.npy")) % 64, 16u % 64);
}

void WriteRaw(const std::string& path, const std::string& header, const std::string& data, char major = 1) {
  std::ofstream out(path, std::ios::binary);
  out << "\x93NUMPY" << major << '\0';
  if (major == 1) {
    out.put(static_cast<char>(header.size() & 0xff)).put(static_cast<char>(header.size() >> 8));
  } else {
    out.put(static_cast<char>(header.size() & 0xff)).put(static_cast<char>(header.size() >> 8)).put(0).put(0);
  }
  out << header << data;
}

TEST(NpyTest, ReadsVersionTwoHeaders) {
  WriteRaw(Path("v2.npy"), "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\n",
           std::string("\1\0\0\0\2\0\0\0", 8), 2);
  absl::StatusOr<Tensor> t = ReadNpy(Path("v2.npy"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->data_as<int32_t>()[1], 2);
}

TEST(NpyTest, BadFilesGiveClearErrors) {
  struct Bad {
    std::string header, data, message;
  };
  for (const Bad& bad : std::vector<Bad>{
           {"{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }\n", std::string(16, '\0'),
            "dtype '<f8' is not supported"},
           {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }\n", std::string(16, '\0'),
            "Fortran-order"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }\n", std::string(8, '\0'),
            "truncated data: expected 16 bytes"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }\n", "", "bad shape"},
           {"{'fortran_order': False, 'shape': (1,), }\n", "", "no 'descr'"},
           // A shape whose size overflows, or far exceeds the file: refused
           // before anything is allocated.
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }\n",
            std::string(64, '\0'), "is too large"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }\n", std::string(64, '\0'),
            "truncated data: expected 40000000000 bytes"},
       }) {
    WriteRaw(Path("bad.npy"), bad.header, bad.data);
    absl::StatusOr<Tensor> t = ReadNpy(Path("bad.npy"));
    ASSERT_FALSE(t.ok());
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(bad.message));
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(Path("bad.npy")));
  }
  std::ofstream(Path("short.npy")) << "\x93NUM";
  EXPECT_THAT(std::string(ReadNpy(Path("short.npy")).status().message()), HasSubstr("bad magic"));
  EXPECT_EQ(ReadNpy(Path("absent.npy")).status().code(), absl::StatusCode::kNotFound);
}

// A whole .npy file: magic, version major.minor, the header's length (2
// bytes for version 1, else 4; `header_len` overrides it), header, data.
std::string NpyBytes(const std::string& header, const std::string& data, int major = 1, int minor = 0,
                     int64_t header_len = -1) {
  const uint64_t len = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
  std::string out = absl::StrCat("\x93NUMPY", std::string(1, static_cast<char>(major)),
                                 std::string(1, static_cast<char>(minor)));
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) out.push_back(static_cast<char>(len >> (8 * i)));
  return out + header + data;
}

// The file ReadBoth writes: one per test, as ctest runs tests side by side.
std::string BothPath() {
  return Path(absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(), ".npy"));
}

// Reads `bytes` both ways, from memory and from a file, and checks that both
// agree on the outcome.
absl::StatusOr<Tensor> ReadBoth(const std::string& bytes) {
  const std::string path = BothPath();
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  absl::StatusOr<Tensor> from_file = ReadNpy(path);
  absl::StatusOr<Tensor> from_memory = ParseNpy(bytes, path);
  EXPECT_EQ(from_file.status(), from_memory.status());
  if (from_file.ok() && from_memory.ok()) {
    EXPECT_EQ(from_file->dtype(), from_memory->dtype());
    EXPECT_EQ(from_file->shape(), from_memory->shape());
    EXPECT_EQ(std::memcmp(from_file->data(), from_memory->data(), from_file->nbytes()), 0);
  }
  return from_file;
}

TEST(NpyTest, ReadsEveryNumpyStyleHeader) {
  struct Good {
    std::string header;
    DType dtype;
    std::vector<int64_t> shape;
    int major = 1;
  };
  const std::string numpy_pad = std::string(5, ' ') + "\n";
  for (const Good& good : std::vector<Good>{
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }" + numpy_pad, DType::kF32, {3, 4}},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }\n", DType::kF32, {3, 4}, 2},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }\n", DType::kF32, {3, 4}, 3},
           {"{'descr': '<i4', 'fortran_order': False, 'shape': (), }\n", DType::kI32, {}},
           {"{'descr': '<u2', 'fortran_order': False, 'shape': (0,), }\n", DType::kBF16, {0}},
           {"{'descr': '<u2', 'fortran_order': False, 'shape': (5,), }\n", DType::kBF16, {5}},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 0, 3), }\n", DType::kF32, {2, 0, 3}},
           // Double quotes, another key order, no trailing comma, no newline.
           {R"({"shape": (3, 4), "descr": "<i4", "fortran_order": False})", DType::kI32, {3, 4}},
           // Whitespace wherever Python allows it, a trailing comma in the tuple.
           {"  {  'descr' :\t'<f4' ,\n 'fortran_order'  :  False,\r\n'shape':(  3 ,4 , ) ,  }  \t\n\n",
            DType::kF32, {3, 4}},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': ( ), }\n", DType::kF32, {}},
       }) {
    SCOPED_TRACE(good.header);
    Tensor want(good.dtype, good.shape);
    FillRandom(want, Dist::kBits, 3);
    const std::string data(static_cast<const char*>(want.data()), want.nbytes());
    absl::StatusOr<Tensor> t = ReadBoth(NpyBytes(good.header, data + "trailing bytes", good.major));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->dtype(), good.dtype);
    EXPECT_EQ(t->shape(), good.shape);
    EXPECT_EQ(std::memcmp(t->data(), want.data(), want.nbytes()), 0);
  }
}

TEST(NpyTest, ParsesWhatWriteNpyWrites) {
  Tensor t(DType::kBF16, {4, 1});
  FillRandom(t, Dist::kBits, 9);
  ASSERT_TRUE(WriteNpy(Path("written.npy"), t).ok());
  std::ifstream in(Path("written.npy"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(bytes, HasSubstr("{'descr': '<u2', 'fortran_order': False, 'shape': (4, 1), }"));
  EXPECT_EQ(bytes[bytes.size() - t.nbytes() - 1], '\n');
  absl::StatusOr<Tensor> back = ParseNpy(bytes, "written.npy");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shape(), t.shape());
  EXPECT_EQ(std::memcmp(back->data(), t.data(), t.nbytes()), 0);
}

TEST(NpyTest, HeaderIsParsedStrictly) {
  struct Bad {
    std::string header, message;
  };
  const std::string data(64, '\0');
  for (const Bad& bad : std::vector<Bad>{
           // A key's text inside a string value is not the key.
           {R"h({'descr': "'shape': (1, 1)", 'fortran_order': False, 'shape': (3, 4), })h",
            "dtype ''shape': (1, 1)' is not supported"},
           {R"h({'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'note': "'shape': (1, 1)"})h",
            "header has unknown key 'note' (expected 'descr', 'fortran_order' and 'shape')"},
           {"{'descr': '<f4', 'fortran_order': 1, 'shape': (3, 4), }",
            "header: 'fortran_order' must be True or False, found '1'"},
           {"{'descr': '<f4', 'fortran_order': false, 'shape': (3, 4), }",
            "header: 'fortran_order' must be True or False, found 'false'"},
           {"{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }", "Fortran-order arrays are not supported"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,,4), }", "bad shape '(3,,4)': empty element"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (,), }", "bad shape '(,)': empty element"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4}", "bad shape '(3, 4': unclosed tuple"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4", "bad shape '(3, 4': unclosed tuple"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3 4), }",
            "bad shape '(3 4)': expected ',' or ')' between dimensions"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (5), }",
            "bad shape '(5)': not a tuple (write (5,) for one dimension)"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
            "bad shape '(-1,)': '-1' is not a non-negative integer"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3.5,), }",
            "bad shape '(3.5,)': '3.5' is not a non-negative integer"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (03,), }",
            "bad shape '(03,)': '03' is not a non-negative integer"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
            "bad shape '(99999999999999999999,)': dimension 99999999999999999999 is too large"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': [3, 4], }",
            "header: 'shape' must be a tuple, found '[3, 4], }'"},
           {"{'descr': 3, 'fortran_order': False, 'shape': (3, 4), }",
            "header: 'descr' must be a quoted string, found '3, "},
           {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }",
            "'descr' is a list: structured dtypes are not supported"},
           {"{'descr': '<f4', 'descr': '<i4', 'fortran_order': False, 'shape': (3, 4), }",
            "header has key 'descr' twice"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'shape': (1,)}", "header has key 'shape' twice"},
           {"{'descr': '<f4', 'shape': (3, 4), }", "header has no 'fortran_order'"},
           {"{'descr': '<f4', 'fortran_order': False}", "header has no 'shape'"},
           {"{}", "header has no 'descr'"},
           {"{'descr': '<i2', 'fortran_order': False, 'shape': (3,), }",
            "dtype '<i2' is not supported: bfloat16 data must be '<u2'"},
           {"{'descr': '|u2', 'fortran_order': False, 'shape': (3,), }",
            "dtype '|u2' is not supported: little-endian ('<') is required"},
           {"{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }",
            "dtype '>f4' is not supported: little-endian ('<') is required"},
           {"{'descr': 'i4', 'fortran_order': False, 'shape': (3,), }",
            "dtype 'i4' is not supported: little-endian ('<') is required"},
           {"{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
            "dtype '<f8' is not supported (use <f4, <i4, or <u2 holding bfloat16 bits)"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), } x", "header has text after its dict: 'x'"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }}", "header has text after its dict: '}'"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,) 'x': 1}",
            "header: expected ',' or '}' after the value of 'shape', found ''x': 1}'"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,)", "header: the dict is not closed"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,),", "header: a key must be a quoted string, found the end"},
           {"{'descr' '<f4'}", "header: expected ':' after key 'descr', found ''<f4'}'"},
           {"{descr: '<f4'}", "header: a key must be a quoted string, found 'descr: '<f4'}'"},
           {"{'descr': '<f4}", "header: unterminated string ''<f4}'"},
           {"{'descr': '<\\x66\\x34'}", "header: escape sequences in strings are not supported"},
           {"['descr', '<f4']", "header is not a dict: found '['descr', '<f4']'"},
           {"", "header is not a dict: found the end of the header"},
       }) {
    SCOPED_TRACE(bad.header);
    for (int major : {1, 2}) {
      absl::StatusOr<Tensor> t = ReadBoth(NpyBytes(bad.header + "  \n", data, major));
      ASSERT_FALSE(t.ok());
      EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(t.status().message()), HasSubstr(bad.message));
      EXPECT_THAT(std::string(t.status().message()), HasSubstr(BothPath() + ": "));
    }
  }
}

TEST(NpyTest, ErrorsQuoteFileTextPrintablyOnOneLine) {
  // A terminal escape, a NUL, invalid UTF-8 and a tab in the descr.
  absl::StatusOr<Tensor> t = ParseNpy(NpyBytes(absl::StrCat("{'descr': '\x1b[2J", std::string(1, '\0'),
                                                            "\xff\x9b\t', 'fortran_order': False, 'shape': (3,)}"),
                                               ""),
                                      "f.npy");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(R"(dtype '\x1b[2J\x00\xff\x9b\t' is not supported)"));
  // A long key is cut.
  t = ParseNpy(NpyBytes(absl::StrCat("{'", std::string(200, 'k'), "\x07': 1}"), ""), "f.npy");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr(absl::StrCat("unknown key '", std::string(60, 'k'), "...'")));
  // A long shape is cut too, and nothing of the file escapes unescaped.
  t = ParseNpy(NpyBytes(absl::StrCat("{'shape': (", std::string(100, '1'), "\x1b\n,)}"), ""), "f.npy");
  ASSERT_FALSE(t.ok());
  const std::string message(t.status().message());
  EXPECT_THAT(message, HasSubstr(absl::StrCat("bad shape '(", std::string(59, '1'), "...'")));
  for (char c : message) EXPECT_GE(static_cast<unsigned char>(c), 0x20) << message;
  EXPECT_LE(message.size(), 300u);
}

TEST(NpyTest, PreambleAndDataChecks) {
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
  struct Bad {
    std::string bytes, message;
  };
  for (const Bad& bad : std::vector<Bad>{
           {"", "not a .npy file (bad magic)"},
           {std::string("\x93NUMPX\x01\x00\x00\x00", 10), "not a .npy file (bad magic)"},
           {std::string("\x93NUMPY\x01\x00\x05", 9), "truncated header"},
           {std::string("\x93NUMPY\x02\x00\x05\x00\x00", 11), "truncated header"},
           {NpyBytes(header, "", 4), "unsupported .npy format version 4.0"},
           {NpyBytes(header, "", 1, 1), "unsupported .npy format version 1.1"},
           {NpyBytes(header, std::string(8, '\0'), 2, 0, (1 << 20) + 1), "header too long (1048577 bytes)"},
           {NpyBytes(header, "", 2, 0, 1000), "truncated header"},
           {NpyBytes(header, std::string(7, '\0')), "truncated data: expected 8 bytes for shape (2,), found 7"},
           {NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", ""),
            "truncated data: expected 4 bytes for shape (), found 0"},
       }) {
    SCOPED_TRACE(bad.bytes);
    absl::StatusOr<Tensor> t = ReadBoth(bad.bytes);
    ASSERT_FALSE(t.ok());
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(bad.message));
  }
}

TEST(NpyTest, RefusesWhatIsNotARegularFile) {
  // A FIFO with no writer would block a plain open() forever.
  const std::string fifo = Path("fifo.npy");
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<Tensor> t = ReadNpy(fifo);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), fifo + ": not a regular file");
  std::filesystem::remove(fifo);
  const std::string dir = Path("dir.npy");
  std::filesystem::create_directories(dir);
  EXPECT_EQ(ReadNpy(dir).status().message(), dir + ": not a regular file");
  EXPECT_THAT(std::string(ReadNpy(Path("absent.npy")).status().message()), HasSubstr("cannot open file"));
}

TEST(PrintableTest, EscapesControlsAndInvalidUtf8) {
  EXPECT_EQ(Printable("plain text, 1 + 2"), "plain text, 1 + 2");
  EXPECT_EQ(Printable("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82 \xc2\xa0"),
            "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82 \xc2\xa0");  // é, 日本, 🙂, NBSP
  EXPECT_EQ(Printable("a\nb\tc\rd"), R"(a\nb\tc\rd)");
  EXPECT_EQ(Printable(std::string("\0\x01\x1b[31m\x1f\x7f", 9)), R"(\x00\x01\x1b[31m\x1f\x7f)");
  EXPECT_EQ(Printable("\xc2\x80\xc2\x9b\xc2\x9f"), R"(\xc2\x80\xc2\x9b\xc2\x9f)");  // C1 controls
  EXPECT_EQ(Printable("\x9b\xff\xc0\xaf"), R"(\x9b\xff\xc0\xaf)");                  // not UTF-8
  EXPECT_EQ(Printable("\xe6\x97"), R"(\xe6\x97)");                                  // cut short
  EXPECT_EQ(Printable("\xed\xa0\x80"), R"(\xed\xa0\x80)");                         // a surrogate
  EXPECT_EQ(Printable(R"(back\slash)"), R"(back\slash)");
  EXPECT_EQ(Printable(""), "");
}

}  // namespace
}  // namespace kreg
