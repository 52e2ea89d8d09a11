#!/bin/bash
# tests/tty/interrupt_tty.sh SHMAP - Ctrl-C after `c` stops where the
# program is, as pdb's does (LANGUAGE.md §7): "Program interrupted", the
# prompt at the current line of the main thread, or of every device inside
# a shard_map body; the values there can be read and `q` ends the run.
#
# Prints "PASS tty/interrupt_tty", "FAIL tty/interrupt_tty" with the screen,
# or "SKIP tty/interrupt_tty: ..." (exit status 77) when tmux is absent.
set -u
shmap=${1:?usage: interrupt_tty.sh SHMAP}
name=tty/interrupt_tty
# tty_setup, screen, wait_for, keys
. "$(dirname "$0")/tmux.bash"
tty_setup
cat >"$tmp/main.shm" <<'SHM'
i = 0
breakpoint()
while True:
    i = i + 1
SHM
cat >"$tmp/body.shm" <<'SHM'
mesh m(i=2)
def body(x):
    k = 0
    breakpoint()
    while True:
        k = k + 1
    return x
f = shard_map(body, mesh=m, in_specs=P('i'), out_specs=P('i'))
f(arange(2.))
SHM

session() {
  tmux -S "$sock" kill-session -t dbg 2>/dev/null
  tmux -S "$sock" new-session -d -s dbg -x 100 -y 40 \
    "cd '$tmp' && env SHMAP_CONFIG= HOME='$tmp' XDG_STATE_HOME='$tmp' '$shmap' $1; echo \"EXITED \$?\"; sleep 60"
}

session main.shm
wait_for '^(shmap-dbg)'
keys c Enter
sleep 0.5
keys C-c
wait_for '^Program interrupted. (Use .cont. to resume).$'
wait_for '^-> ' 2   # the line it was on: the loop's test or its body
keys 'p i > 0' Enter
wait_for '^True$'
keys q Enter
wait_for '^EXITED 1$'

session body.shm
wait_for '^(shmap-dbg (i=0))'
keys c Enter
sleep 0.5
keys C-c
wait_for '^Program interrupted. (Use .cont. to resume).$'
keys 'p k > 0 @ all' Enter
wait_for '^(i=1): True$'
wait_for '^(i=0): True$'
keys q Enter
wait_for '^EXITED 1$'
echo "PASS $name"
