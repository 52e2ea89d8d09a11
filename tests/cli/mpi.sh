#!/bin/bash
# tests/cli/mpi.sh SHMAP - devices across processes (LANGUAGE.md section 12):
# programs in which a device fails while its peers on another process wait
# in a collective, processes whose devices reach different collectives (also
# after collectives they shared: xmismatch_*.shm, by the mismatch named), a
# device that returns while the others wait, and an error caught by
# try/except on every process, each run in one process and under
# `mpirun -np 2` (with arrays under 2^18 elements held whole by every
# process: SHMAP_PARTIAL_MIN=262144; by default each holds only its
# blocks) and `-np 4` (also with every
# message by MPI, as between machines: SHMAP_MPI_NO_SHARED): the same output, the same error line and
# exit status, within seconds, never a hang.  Also: a device count the
# processes do not divide, the debugger and a program read from standard
# input are refused with a message;
# --trace writes one file per process.
# A build without MPI says so when started as one of several processes.
set -u
shmap=$(cd "$(dirname "${1:?usage: mpi.sh SHMAP}")" && pwd)/$(basename "$1")
scale=${SHMAP_TEST_SCALE:-1}   # time limits grow in sanitizer builds (run-tests.sh)
progs=$(cd "$(dirname "$0")" && pwd)/progs
fail() { echo "$*"; exit 1; }

if "$shmap" --version | grep -q '^MPI: none'; then
  out=$(OMPI_COMM_WORLD_SIZE=2 "$shmap" -c 'print("ran")' 2>&1); status=$?
  [ "$status" -eq 1 ] || fail "no MPI: exit status $status: $out"
  grep -q "built without MPI" <<<"$out" || fail "no MPI: no message: $out"
  echo "this shmap is built without MPI: only its refusal was tested"; exit 77
fi
command -v mpirun >/dev/null || { echo "mpirun is not installed: MPI runs not tested"; exit 77; }
# Open MPI's libraries are not built with the sanitizers' instrumentation
[ "$scale" -gt 1 ] && { echo "MPI runs are not tested in sanitizer builds"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # CI runs as root
# mpi NP ARGS...: ARGS under mpirun -np NP; NP "4x" is -np 4 with every
# message by MPI, as between processes on different machines (by default
# those on one machine pass small messages through shared memory), "4r"
# with rings of 128 bytes, so records wrap around, small messages longer
# than 48 bytes go by MPI between the others, and bursts wait in queues
mpi() {
  local np=$1 env=()
  shift
  [ "${np%x}" = "$np" ] || { np=${np%x}; env=(SHMAP_MPI_NO_SHARED=1); }
  [ "${np%r}" = "$np" ] || { np=${np%r}; env=(SHMAP_TEST_RING_BYTES=128); }
  # at -np 2 small arrays are held whole by every process (by default
  # each holds only its blocks: array.h, "Process-local shards")
  [ "$np" = 2 ] && [ ${#env[@]} -eq 0 ] && env=(SHMAP_PARTIAL_MIN=262144)
  timeout -s KILL 60 env "${env[@]}" mpirun --oversubscribe --bind-to none -np "$np" "$@"
}

for prog in "$progs"/mpi_*.shm; do
  name=$(basename "$prog")
  want_out=$("$shmap" --devices 4 "$prog" 2>/tmp/mpi_err.$$); want_status=$?
  want_err=$(grep ' error: ' /tmp/mpi_err.$$)
  for np in 2 4 4x 4r; do
    start=$(date +%s)
    got_out=$(cd "$progs" && mpi "$np" "$shmap" --devices 4 "$name" 2>/tmp/mpi_err.$$); got_status=$?
    got_err=$(grep ' error: ' /tmp/mpi_err.$$)
    took=$(($(date +%s) - start))
    [ "$got_status" -ne 137 ] || fail "$name, -np $np: killed after 60 s (a hang)"
    [ "$took" -le 20 ] || fail "$name, -np $np: took $took s"
    [ "$got_status" -eq "$want_status" ] || fail "$name, -np $np: exit status $got_status, one process $want_status: $(cat /tmp/mpi_err.$$)"
    [ "$got_out" = "$want_out" ] || fail "$name, -np $np: output differs: [$got_out] one process: [$want_out]"
    [ "$(sed 's/^.*: error: //' <<<"$got_err")" = "$(sed 's/^.*: error: //' <<<"$want_err")" ] ||
      fail "$name, -np $np: error differs: [$got_err] one process: [$want_err]"
    [ "$(grep -c ' error: ' <<<"$got_err")" -le 1 ] || fail "$name, -np $np: the error is written more than once"
  done
done
rm -f /tmp/mpi_err.$$

# Process-local shards with one device a process, where more layouts
# have blocks on other processes only (every array that can, by default).
want=$("$shmap" --devices 4 "$progs/mpi_partial_shards.shm" 2>&1)
got=$(cd "$progs" && timeout -s KILL 60 mpirun --oversubscribe --bind-to none \
      -np 4 "$shmap" --devices 4 mpi_partial_shards.shm 2>&1) ||
  fail "mpi_partial_shards.shm, -np 4, every array local: exit status $?: $got"
[ "$got" = "$want" ] ||
  fail "mpi_partial_shards.shm, -np 4, every array local: output [$got], one process [$want]"

# Mismatches after collectives every device shared (the headers a process
# accepted before, x_header_known): exit status 1 and the mismatch its
# "# expect:" line names at -np 1, 2 and 4, whichever of the two devices
# reports it.
for prog in "$progs"/xmismatch_*.shm; do
  name=$(basename "$prog")
  want=$(sed -n 's/^# expect: //p' "$prog")
  for np in 1 2 4 4x; do
    if [ "$np" = 1 ]; then
      err=$(cd "$progs" && timeout -s KILL 60 "$shmap" --devices 4 "$name" 2>&1 >/dev/null); status=$?
    else
      err=$(cd "$progs" && mpi "$np" "$shmap" --devices 4 "$name" 2>&1 >/dev/null); status=$?
    fi
    got=$(grep ' error: ' <<<"$err" | sed 's/^.*: error: on device ([^)]*): //')
    [ "$status" -eq 1 ] || fail "$name, -np $np: exit status $status: $err"
    [ "$got" = "$want" ] || fail "$name, -np $np: error [$got], expected [$want]"
  done
done

# bursts of small messages nobody reads yet: more than a ring of 1 KiB
# holds (a queue that lost them fails this)
want=$("$shmap" --devices 16 "$progs/ring_burst.shm" 2>&1)
for ring in "" 1024; do
  got=$(SHMAP_TEST_RING_BYTES=$ring mpi 2 "$shmap" --devices 16 "$progs/ring_burst.shm" 2>&1) ||
    fail "ring_burst.shm, rings of ${ring:-default} bytes: exit status $?: $got"
  [ "$got" = "$want" ] || fail "ring_burst.shm, rings of ${ring:-default} bytes: output [$got], one process [$want]"
done

# records still queued for a full ring when their sender sends an MPI
# message (the end of a call) reach the receiver before it: a record that
# came after it was read in the next call as a device that returned
want=$("$shmap" --devices 16 "$progs/ring_order.shm" 2>&1)
for run in 1 2 3; do
  got=$(SHMAP_TEST_RING_BYTES=128 mpi 2 "$shmap" --devices 16 "$progs/ring_order.shm" 2>&1) ||
    fail "ring_order.shm, run $run: exit status $?: $got"
  [ "$got" = "$want" ] || fail "ring_order.shm, run $run: output [$got], one process [$want]"
done

# a process that ends with an error of its own while another waits for it
# in a collective: the waiting one's error quotes the other's (whose
# output nobody sees)
ddir=$(mktemp -d)
printf '%s\n' 'import jax, jax.numpy as jnp' 'from jax.sharding import PartitionSpec as P' \
  'if jax.process_index() == 1:' '    x = jnp.ones(3) + jnp.ones(4)' \
  "f = jax.shard_map(lambda v: jax.lax.psum(v, 'i'), mesh=jax.make_mesh((4,), ('i',)), in_specs=P('i'), out_specs=P())" \
  'print(f(jnp.ones(8)))' >"$ddir/div.shm"
out=$(cd "$ddir" && mpi 2 "$shmap" --devices 4 div.shm 2>&1); status=$?
[ "$status" -eq 1 ] || fail "one process's error: exit status $status: $out"
grep -q "^div.shm:6:7: error: process 1 ended the program (exit status 1; its error: div.shm:4:21: error: operands could not be broadcast together with shapes (3,) (4,)) while process 0 waits" <<<"$out" ||
  fail "one process's error: not quoted: $out"
rm -rf "$ddir"

out=$(mpi 3 "$shmap" --devices 4 -c 'print("ran")' 2>&1); status=$?
[ "$status" -ne 0 ] || fail "4 devices over 3 processes ran"
grep -q "cannot be split evenly over 3 processes" <<<"$out" || fail "4 over 3: no message: $out"
# the test runner starts its tests as processes: refused under mpirun, once
out=$(mpi 2 "$shmap" --test "$progs" 2>&1 </dev/null); status=$?
[ "$status" -ne 0 ] || fail "--test under mpirun ran"
[ "$(grep -c 'SHMAP_TEST_MPI=2 shmap --test' <<<"$out")" = 1 ] || fail "--test under mpirun: message: $out"
out=$(mpi 2 "$shmap" --devices 4 --debug -c 'print("ran")' 2>&1 </dev/null); status=$?
[ "$status" -ne 0 ] || fail "--debug under mpirun ran"
grep -q "need one process" <<<"$out" || fail "--debug: no message: $out"
# a program from standard input reaches process 0 alone: refused, not run as empty elsewhere
out=$(printf 'print("ran")\n' | mpi 2 "$shmap" --devices 4 - 2>&1); status=$?
[ "$status" -ne 0 ] || fail "a program from stdin under mpirun ran"
[ "$(grep -c 'standard input needs one process' <<<"$out")" = 1 ] || fail "stdin under mpirun: message: $out"

# Ctrl-C of the job: mpirun sends its processes SIGTERM (then SIGKILL),
# which stops the program with a one-process run's error, written by
# process 0, and an exit status not 0.  The SIGKILL comes 1 s after by
# default (odls_base_sigkill_timeout), which a loaded machine may not
# give a process to be scheduled: 10 s here.  mpirun gets one SIGINT, as
# from a terminal: a second one makes it SIGKILL the job at once, and
# timeout(1) without --foreground sends its signal to mpirun and again to
# its whole process group.
idir=$(mktemp -d)
printf '%s\n' 'print("ready")' 'k = 0' 'while True:' '    k = k + 1' >"$idir/loop.shm"
OMPI_MCA_odls_base_sigkill_timeout=10 timeout --foreground -s KILL 60 \
  mpirun --oversubscribe --bind-to none -np 2 "$shmap" --devices 2 "$idir/loop.shm" >"$idir/out" 2>&1 &
job=$!
for t in $(seq 300); do grep -q ready "$idir/out" && break; sleep 0.1; done
kill -INT $job   # timeout passes it on to mpirun
wait $job; status=$?
[ "$status" -ne 0 ] && [ "$status" -ne 137 ] || fail "Ctrl-C under mpirun: exit status $status: $(cat "$idir/out")"
grep -q '^.*loop.shm:[34]:[0-9]*: error: KeyboardInterrupt: interrupted$' "$idir/out" ||
  fail "Ctrl-C under mpirun: no message: $(cat "$idir/out")"
rm -rf "$idir"

# --trace: each process writes its own devices' timeline, to its own file
tdir=$(mktemp -d)
printf '%s\n' 'mesh m(i=4)' "shard_map f(x: P('i')) -> P('i') on m:" "    return psum(x, 'i')" \
  'print(f(ones(4)))' >"$tdir/p.shm"
out=$(mpi 2 "$shmap" --devices 4 --trace "$tdir/t.json" "$tdir/p.shm" 2>&1) ||
  fail "--trace under mpirun failed: $out"
[ "$out" = "[4. 4. 4. 4.]" ] || fail "--trace under mpirun: output $out"
if command -v python3 >/dev/null; then
  python3 - "$tdir" <<'PY' || fail "--trace under mpirun: the files are not one timeline per process"
import json, sys
for p, f, devs in [(1, "t.json", {"device 0", "device 1"}), (2, "t.1.json", {"device 2", "device 3"})]:
    ev = json.load(open(sys.argv[1] + "/" + f))["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert devs <= names and not ({"device 0", "device 1", "device 2", "device 3"} - devs) & names, (f, names)
    assert {e["pid"] for e in ev} == {p}, f
PY
fi
rm -rf "$tdir"
exit 0
