# tests/tty/tmux.bash - what the terminal tests share, sourced (not run:
# the runner runs tests/tty/*.sh only).  The caller sets [name], then
# calls tty_setup, which sets [tmp] and [sock] (its tmux server's socket);
# the session is called dbg.

# Skips the test (exit status 77) when tmux is not installed; else makes
# the folder [tmp], removed with the tmux server at exit.
tty_setup() {
  if ! command -v tmux >/dev/null 2>&1; then
    echo "SKIP $name: tmux is not installed"
    exit 77
  fi
  tmp=$(mktemp -d)
  sock=$tmp/tmux.sock
  trap 'tmux -S "$sock" kill-server 2>/dev/null; rm -rf "$tmp"' EXIT
}

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
