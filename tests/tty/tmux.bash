# tests/tty/tmux.bash - what the terminal tests share, sourced (not run:
# the runner runs tests/tty/*.sh only).  The caller sets [name] and [sock]
# (its tmux server's socket); the session is called dbg.

# The screen as text, one line per row.
screen() { tmux -S "$sock" capture-pane -p -t dbg; }

# Waits up to 10 s until the screen has [count] lines matching [pattern].
wait_for() {
  local pattern=$1 count=${2:-1}
  for _ in $(seq 1 100); do
    [ "$(screen | grep -c -- "$pattern")" -ge "$count" ] && return 0
    sleep 0.1
  done
  echo "FAIL $name: expected $count line(s) matching '$pattern'; the screen:"
  screen | sed 's/^/    /'
  exit 1
}

keys() { tmux -S "$sock" send-keys -t dbg "$@"; }
