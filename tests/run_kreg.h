// Runs the kreg binary for the end-to-end tests, with their scratch folders.
#ifndef KREG_TESTS_RUN_KREG_H_
#define KREG_TESTS_RUN_KREG_H_

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"

namespace kreg {

struct Result {
  int code;         // exit status (128 if killed)
  std::string out;  // stdout, then stderr
  std::string stdout_text;
  std::string stderr_text;
};

// Runs `sh -c "ENV BINARY ARGS"`, stdout and stderr apart.
inline Result RunCommand(const std::string& env, const std::string& binary, const std::string& args) {
  static std::atomic<int> counter{0};
  const std::string err_file = "/tmp/kreg_test_stderr_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
  std::string cmd = env + " " + binary + " " + args + " 2>" + err_file;
  FILE* pipe = popen(cmd.c_str(), "r");
  Result r{128, "", "", ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.stdout_text.append(buf, n);
  int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  std::ifstream in(err_file, std::ios::binary);
  r.stderr_text.assign(std::istreambuf_iterator<char>(in), {});
  std::remove(err_file.c_str());
  r.out = r.stdout_text + r.stderr_text;
  return r;
}

// Runs `env kreg --plugin_path=PLUGINS args`, without the shipped tables
// (KREG_TABLE_PATH empty) unless `env` sets KREG_TABLE_PATH: answers then
// depend on the test's tables alone.
inline Result RunKreg(const std::string& plugins, const std::string& args, const std::string& env = "") {
  const std::string tables = env.find("KREG_TABLE_PATH=") == std::string::npos ? "KREG_TABLE_PATH= " : "";
  return RunCommand(tables + env, KREG_BIN, "--plugin_path=" + plugins + " " + args);
}

// An empty scratch folder of this test process's own (two builds' tests may
// run at once): TempDir/kreg_PREFIX_NAME_PID.
inline std::string ScratchDir(const std::string& prefix, const std::string& name) {
  std::string dir = ::testing::TempDir() + "/kreg_" + prefix + "_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A file's bytes ("" when it cannot be read).
inline std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace kreg

#endif  // KREG_TESTS_RUN_KREG_H_
