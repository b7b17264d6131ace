// The kreg binary (the command line itself is kreg_cli: kreg.cc).
#include "tools/cli.h"

int main(int argc, char** argv) { return kreg::cli::Main(argc, argv); }
