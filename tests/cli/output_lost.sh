#!/bin/bash
# tests/cli/output_lost.sh SHMAP - output that cannot be written is an
# error, never lost with exit status 0 (it used to be): to /dev/full the
# print whose write fails (or, for a last few lines, the final flush) says
# "[Errno 28] No space left on device", as Python's OSError; with the
# standard output closed the first print says "[Errno 9] Bad file
# descriptor", and no file the program opens takes descriptor 1.
set -u
shmap=${1:?usage: output_lost.sh SHMAP}
[ -w /dev/full ] || { echo "no /dev/full: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Runs [program] with stdout redirected as [how] says ("full" or
# "closed"); requires exit status [status] and [text] in the standard
# error (an empty [text]: an empty standard error).
expect() {
  local how=$1 status=$2 text=$3 program=$4 got
  if [ "$how" = full ]; then
    "$shmap" -c "$program" >/dev/full 2>"$dir/err"
  else
    "$shmap" -c "$program" >&- 2>"$dir/err"
  fi
  got=$?
  if [ "$got" -ne "$status" ] || { [ -n "$text" ] && ! grep -qF -- "$text" "$dir/err"; } ||
     { [ -z "$text" ] && [ -s "$dir/err" ]; }; then
    echo "stdout $how: $program: status $got (expected $status); stderr:"; cat "$dir/err"
    exit 1
  fi
}
full28='error: cannot write the standard output: [Errno 28] No space left on device'
# a print's failure is an uncaught OSError; the last flush's is the program's
full28_located='error: OSError: cannot write the standard output: [Errno 28] No space left on device'
# a line that stays in the buffer until the end: the last flush fails
expect full 1 "shmap: $full28" 'print("hi")'
# lines past a buffer: the print whose write fails, with its location
expect full 1 "<string>:2:5: $full28_located" 'for i in range(10000):
    print(i)
print("not reached")'
# flush=True: the write fails at once
expect full 1 "<string>:1:1: $full28_located" 'print("hi", flush=True)
x = 1'
# the program's own error is reported, not the lost output's as well
expect full 1 "name 'y' is not defined" 'print("hi")
y'
expect full 0 '' 'x = 1'
bad9='error: OSError: cannot write the standard output: [Errno 9] Bad file descriptor'
expect closed 1 "<string>:1:1: $bad9" 'print("hi")'
expect closed 0 '' 'x = 2'
# a file made with stdout closed does not get the program's output
expect closed 1 "<string>:3:1: $bad9" "save('$dir/a.npy', ones(3))
b = load('$dir/a.npy')
print(b)"
"$shmap" -c "print(load('$dir/a.npy'))" | grep -qF '[1. 1. 1.]' || { echo "a.npy was written over"; exit 1; }
exit 0
