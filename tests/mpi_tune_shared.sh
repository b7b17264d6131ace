#!/bin/sh
# kreg tune under mpirun for an op that is not a collective (kreg::TuneAcross):
#  1. two ranks of this machine split one problem's candidates, and a third,
#     made another machine by KREG_ISA_MASK, tunes it for its own; between
#     them they measure every candidate once (as many trials as one
#     process's sweep);
#  2. the same command again reuses every result;
#  3. two problems on two ranks: one problem each;
#  4. a rank killed mid-sweep ends the job, and the table keeps every result
#     rank 0 had; the same command resumes from them.
# Arguments: MPIEXEC KREG TABLE.
set -e
mpiexec=$1 kreg=$2 db=$3
out=$db.out
tune="tune topk --backend mpi --strategy exhaustive --reps 3 --list-growth-rounds 0 --no-thread-round --db $db"
one="--dims batch=4,n=1000,k=8"
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }
trials() {  # trials of the entries of machine $2 in table $1
  "$kreg" db show "$1" | grep "@$2 " | sed 's/.* \([0-9]*\) trials)$/\1/' | awk '{s += $1} END {print s + 0}'
}
rm -f "$db" "$db.one" "$db.lock" "$db.one.lock"

# 1.
"$mpiexec" -n 2 "$kreg" $tune $one : -n 1 env KREG_ISA_MASK=fma "$kreg" $tune $one > "$out" 2>&1 || fail "split run"
grep -q "on ranks 0,1 (" "$out" || fail "ranks 0 and 1 did not share the problem"
grep -q "on rank 2 (.*, sse," "$out" || fail "rank 2 did not tune for its own machine"
"$kreg" tune topk $one --strategy exhaustive --reps 3 --list-growth-rounds 0 --no-thread-round --db "$db.one" > /dev/null 2>&1
here=$("$kreg" db show "$db.one" | sed -n 's/.*@\([0-9a-f]*\) .*/\1/p')
[ "$(trials "$db" "$here")" = "$(trials "$db.one" "$here")" ] ||
  fail "shared: $(trials "$db" "$here") trials, one process: $(trials "$db.one" "$here")"
echo "1. split between ranks 0 and 1: $(trials "$db" "$here") trials, as one process"

# 2.
"$mpiexec" -n 2 "$kreg" $tune $one : -n 1 env KREG_ISA_MASK=fma "$kreg" $tune $one > "$out" 2>&1 || fail "resume"
[ "$(grep -c " 0 measured" "$out")" = 2 ] || fail "the second run measured again"
echo "2. the same command again measures nothing"

# 3.
"$mpiexec" -n 2 "$kreg" $tune $one --dims batch=2,n=3000,k=4 > "$out" 2>&1 || fail "two problems"
grep -A2 "batch=2,n=3000,k=4" "$out" | grep -q "on rank [01] " || fail "a problem was split"
grep -A2 "batch=2,n=3000,k=4" "$out" | grep -q " 0 reused" || fail "batch=2,n=3000,k=4 was not measured"
echo "3. two problems, one per rank"

# 4. Kill rank 1 once the table holds results; the job ends (mpirun ends
# every rank); the table keeps them and the same command resumes.
rm -f "$db"
big="--dims batch=64,n=20000,k=16"
# This job's ranks carry a mark of their own (other MPI tests may run at the
# same time); rank 1 is the one with it and OMPI_COMM_WORLD_RANK=1.
mark="KREG_SHARED_TEST_JOB=$$"
env "$mark" "$mpiexec" -n 2 "$kreg" $tune $big > "$out" 2>&1 &
job=$!
seen=0
for i in $(seq 1 600); do
  [ -f "$db" ] && seen=$(trials "$db" "$here")
  [ "$seen" -ge 50 ] && break
  sleep 0.1
done
[ "$seen" -ge 50 ] || fail "no results came in 60 s"
for p in /proc/[0-9]*; do
  [ "$(cat "$p/comm" 2>/dev/null)" = kreg ] || continue
  # (a process may end between the two reads: not an error)
  environ=$({ tr '\0' '\n' < "$p/environ"; } 2>/dev/null || true)
  if echo "$environ" | grep -qx "OMPI_COMM_WORLD_RANK=1" && echo "$environ" | grep -qx "$mark"; then
    kill -9 "${p#/proc/}"
  fi
done
if wait "$job"; then fail "the job went on without rank 1"; fi
kept=$(trials "$db" "$here")
[ "$kept" -ge "$seen" ] || fail "the table lost results: $kept trials after the kill, $seen before"
"$mpiexec" -n 2 "$kreg" $tune $big > "$out" 2>&1 || fail "resume after the kill"
reused=$(sed -n 's/.* \([0-9]*\) reused.*/\1/p' "$out")
[ "$reused" -ge "$kept" ] || fail "resumed with $reused reused, the table had $kept"
echo "4. rank 1 killed after $seen results; the table kept $kept; the next run reused $reused"
