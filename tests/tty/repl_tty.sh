#!/bin/bash
# tests/tty/repl_tty.sh SHMAP - the REPL at a real terminal (tmux): it
# greets with its banner (version, devices, where help is), as Python's
# prompt does; `if 0: print(1)` then `else: print(2)` is one entry, ended
# by an empty line; help() answers; Tab completes jnp.ara; Ctrl-D leaves.
# With a script and -i there is no banner, as with Python's -i.
#
# Prints "PASS tty/repl_tty", "FAIL tty/repl_tty" with the screen, or
# "SKIP tty/repl_tty: ..." (exit status 77) when tmux is not installed.
set -u
shmap=${1:?usage: repl_tty.sh SHMAP}
name=tty/repl_tty
# tty_setup, screen, wait_for, keys
. "$(dirname "$0")/tmux.bash"
tty_setup
echo 'x = 5' >"$tmp/t.shm"

# HOME and XDG_STATE_HOME point into $tmp so no history file of the user's
# is read or written.
tmux -S "$sock" new-session -d -s dbg -x 100 -y 40 \
  "cd '$tmp' && env SHMAP_CONFIG= HOME='$tmp' XDG_STATE_HOME='$tmp' '$shmap' --devices 4; echo \"EXITED \$?\"; '$shmap' -i t.shm; echo \"EXITED \$?\"; sleep 60"

wait_for '^shmap .* (4 devices): '
wait_for '^Type help() for help'
wait_for '^>>> *$'
keys 'if 0: print(1)' Enter
wait_for '^\.\.\. *$'
keys 'else: print(2)' Enter Enter
wait_for '^2$'
keys 'help()' Enter
wait_for "^Welcome to shmap's help"
keys 'jnp.ara' Tab '(2)' Enter             # Tab completes an attribute
wait_for '^Array(\[0, 1\], dtype=int32)$'
keys C-d
wait_for '^EXITED 0$'
wait_for '^>>> *$'
keys 'x' Enter
wait_for '^5$'
keys C-d
wait_for '^EXITED 0$' 2
if [ "$(screen | grep -c '^Type help() for help')" != 1 ]; then
  echo "FAIL $name: a banner after a script run with -i"
  screen | sed 's/^/    /'
  exit 1
fi
echo "PASS $name"
