#!/bin/sh
# Runs one rank of strata-bench under mpirun and, on rank 1, stops it (SIGSTOP) once it has
# started its run (it printed "measuring sequential read bandwidth"), as a rank that hangs would.
# The other ranks must fail at --comm-timeout and end the job (tests/bench/CMakeLists.txt).
# usage: stopped_rank.sh STRATA_BENCH LOG_PREFIX ARGS...
bin=$1
log=$2.$$.err
shift 2
if [ "${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" = 1 ]; then
  : >"$log"
  # $$ is this shell, which exec turns into strata-bench. Gives up after 60 s.
  (i=0
   while [ $i -lt 600 ] && ! grep -q "measuring sequential read bandwidth" "$log"; do sleep 0.1; i=$((i + 1)); done
   kill -STOP $$) &
  exec "$bin" "$@" 2>"$log"
fi
exec "$bin" "$@"
