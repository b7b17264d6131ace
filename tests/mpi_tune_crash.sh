#!/bin/sh
# A sweep under mpirun whose candidates kill the job (allreduce/faulty
# mode=die on ranks 0 and 1 of 2): each run records the candidate in flight
# as crashed and dies; the next run skips it and goes on; the third
# finishes, and its key names the job's backend and nodes, which kreg query
# finds. Exhaustive, then halving (whose early rounds mark a candidate in
# flight among its partial measurements). Arguments: MPIEXEC KREG
# PLUGIN_PATH TABLE.
mpiexec=$1 kreg=$2 plugins=$3 db=$4
sweep() {  # STRATEGY
  rm -f "$db"
  for run in 1 2 3 4; do
    if "$mpiexec" -n 2 "$kreg" --plugin-path "$plugins" tune allreduce --backend mpi --dims count=100 \
        --variants faulty --strategy "$1" --reps 3 --comm-timeout 5 --db "$db"; then
      crashed=$("$kreg" db export "$db" | awk '/^  trials \{/ { t = 1; f = 0 }
          t && /in flight when the MPI job ended/ { f = 1 }  t && /^  \}/ { c += f; t = 0 }  END { print c + 0 }')
      echo "$1: finished on run $run; $crashed candidates recorded as crashed in flight"
      [ "$run" = 3 ] && [ "$crashed" = 2 ] || return 1
      "$kreg" --plugin-path "$plugins" query allreduce --backend mpi --nodes 1 --ranks 2 --dims count=100 \
          --db "$db" | tee /dev/stderr | grep -q "\[backend=mpi,nodes=1\].*exact"
      return $?
    fi
  done
  return 1
}
sweep exhaustive && sweep halving
