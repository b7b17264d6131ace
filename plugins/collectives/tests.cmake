# The collectives' tests beyond conformance_test.cc, included by
# tests/CMakeLists.txt. Under mpirun (the mpi backend), where MPI is found:
# each variant on 3 ranks and a few rank counts and dtypes in the test
# command; every variant x rank count 1-8 x dtype under the slow label; the
# sharded matmul on a 2 x 2 mesh of processes.
if(COMMAND kreg_add_mpi_test)
  foreach(op allgather allreduce reduce_scatter)
    foreach(variant ring doubling direct)
      kreg_add_mpi_test(3 ${op}/${variant} f32 count=1001 mpi)
      foreach(ranks RANGE 1 8)
        foreach(dtype f32 bf16 i32)
          kreg_add_mpi_test(${ranks} ${op}/${variant} ${dtype} count=4097 slow)
        endforeach()
      endforeach()
    endforeach()
  endforeach()
  kreg_add_mpi_test(1 allreduce/ring bf16 count=5 mpi)
  kreg_add_mpi_test(4 allreduce/doubling bf16 count=3,reduction=1 mpi)
  kreg_add_mpi_test(2 reduce_scatter/ring i32 count=0 mpi)
  foreach(variant plain overlapped)
    add_test(NAME mpi_sharded_matmul_${variant}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 $<TARGET_FILE:kreg> run sharded_matmul/${variant}
              --backend mpi --mesh 2x2 --dims m=64,k=96,n=40 --check --reps 2 --warmup 1 --comm-timeout 60)
    set_tests_properties(mpi_sharded_matmul_${variant} PROPERTIES
      LABELS mpi ENVIRONMENT "${mpi_env}" PASS_REGULAR_EXPRESSION "check ok" TIMEOUT 120)
  endforeach()
endif()
