#!/bin/bash
# tests/tty/debug_tty.sh SHMAP - one debugger session through a real
# terminal (tmux): breakpoint() shows the `(shmap-dbg) ` prompt, readline
# edits the line (Backspace, Ctrl-A), Up recalls the history, an empty line
# repeats the last command, Tab completes names and attributes (jnp.ara),
# Ctrl-C abandons the line being typed, `c` goes on, and the program ends
# normally.
#
# Prints "PASS tty/debug_tty", "FAIL tty/debug_tty" with the screen, or
# "SKIP tty/debug_tty: ..." (exit status 77) when tmux is not installed.
set -u
shmap=${1:?usage: debug_tty.sh SHMAP}
name=tty/debug_tty
# tty_setup, screen, wait_for, keys
. "$(dirname "$0")/tmux.bash"
tty_setup
cat >"$tmp/t.shm" <<'SHM'
answer_to_all = 42
x = 41
breakpoint()
y = x + 1
print('y is', y)
SHM

# HOME and XDG_STATE_HOME point into $tmp so no history file of the user's
# is read or written.
tmux -S "$sock" new-session -d -s dbg -x 100 -y 40 \
  "cd '$tmp' && env SHMAP_CONFIG= HOME='$tmp' XDG_STATE_HOME='$tmp' '$shmap' t.shm; echo \"EXITED \$?\"; sleep 60"

wait_for '^(shmap-dbg)'
wait_for '^-> y = x + 1$'
keys 'p x + 9' BSpace 1 Enter             # editing: "p x + 1"
wait_for '^42$'
keys 'x * 2' C-a 'p ' Enter                # Ctrl-A to the start: "p x * 2"
wait_for '^82$'
keys Up Up Enter                           # the history: "p x + 1" again
wait_for '^42$' 2
keys Enter                                 # an empty line repeats it
wait_for '^42$' 3
keys 'p this line is abandoned' C-c         # Ctrl-C: a fresh prompt
wait_for '^(shmap-dbg)' 6
keys n Enter
wait_for '^-> print(.y is., y)$'
keys 'p y + answer_t' Tab Enter            # Tab completes answer_to_all
wait_for '^84$'
keys 'p jnp.ara' Tab '(3)' Enter           # and an attribute: jnp.arange
wait_for '^Array(\[0, 1, 2\], dtype=int32)$'
keys 'p y' Enter
wait_for '^42$' 4
keys c Enter
wait_for '^y is 42$'
wait_for '^EXITED 0$'
if screen | grep -q "name 'this'"; then
  echo "FAIL $name: the line abandoned with Ctrl-C was run"
  exit 1
fi
echo "PASS $name"
