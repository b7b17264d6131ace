# Dependencies as imported targets (Debian 12 packages; see scripts/deps.sh).
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(TBB REQUIRED)
find_package(dlpack REQUIRED)
find_package(Protobuf REQUIRED)
if(KREG_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(KREG_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
# Optional: MPI (Debian: libopenmpi-dev openmpi-bin) for the mpi backend,
# its tests and the collectives benchmark against Open MPI's own.
find_package(MPI COMPONENTS CXX QUIET)
