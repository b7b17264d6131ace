#include "kreg/npy.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kreg/problem.h"

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

}  // namespace
}  // namespace kreg
