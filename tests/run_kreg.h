// Runs the kreg binary for the end-to-end tests.
#ifndef KREG_TESTS_RUN_KREG_H_
#define KREG_TESTS_RUN_KREG_H_

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace kreg {

struct Result {
  int code;         // exit status (128 if killed)
  std::string out;  // stdout and stderr together
};

// Runs `env kreg --plugin_path=PLUGINS args`.
inline Result RunKreg(const std::string& plugins, const std::string& args, const std::string& env = "") {
  std::string cmd = env + " " + std::string(KREG_BIN) + " --plugin_path=" + plugins + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, out};
}

}  // namespace kreg

#endif  // KREG_TESTS_RUN_KREG_H_
