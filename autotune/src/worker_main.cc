// kreg-worker: the tuner's measuring process (kreg/worker.h). It speaks the
// protocol of autotune/worker.proto on stdin and stdout for the
// IsolatedRunner that started it; it is not a command for people.
#include <unistd.h>

#include <cstdio>

#include "kreg/worker.h"

int main(int argc, char** argv) {
  if (argc > 1 || isatty(0)) {
    std::fprintf(stderr,
                 "%s: kreg's measuring worker, started by the tuner (kreg tune); it reads length-delimited "
                 "protobuf requests on stdin and takes no arguments\n",
                 argc > 0 ? argv[0] : "kreg-worker");
    return 2;
  }
  return kreg::WorkerMain(0, 1);
}
