#!/bin/bash
# tests/cli/source_utf8.sh SHMAP - source text is UTF-8, as Python's: a
# byte-order mark at the start of a file is skipped (it was a syntax
# error), and a byte that does not decode is a located syntax error in
# the words of Python's 'utf-8' codec (such files were accepted, their
# bytes passed into strings), its source line shown with U+FFFD for the
# bad bytes.  The files hold bytes a .shm test cannot.
set -u
shmap=${1:?usage: source_utf8.sh SHMAP}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0

# expect NAME STATUS STDOUT FIRST-STDERR-LINE: runs $dir/NAME.shm.
expect() {
  local out err status
  out=$("$shmap" "$dir/$1.shm" 2>"$dir/err")
  status=$?
  err=$(head -n 1 "$dir/err")
  err=${err#"$dir/"}
  if [ "$status" != "$2" ] || [ "$out" != "$3" ] || [ "$err" != "$4" ]; then
    echo "FAIL $1: status $status, stdout '$out', stderr '$err'"
    echo "  expected status $2, stdout '$3', stderr '$4'"
    fail=1
  fi
}

printf '\xef\xbb\xbfs = "日本"\nprint(len(s), s)\n' >"$dir/bom.shm"
expect bom 0 "2 日本" ""

printf 'x = 1\ns = "日本\xff"\nprint(s)\n' >"$dir/start.shm"
expect start 1 "" "start.shm:2:8: error: SyntaxError: (unicode error) 'utf-8' codec can't decode byte 0xff in position 17: invalid start byte"

# The source line shows the bad byte as U+FFFD, so the caret stands under it.
want=$(printf '    2 | s = "日本\xef\xbf\xbd"\n      |        ^')
if [ "$(tail -n 2 "$dir/err")" != "$want" ]; then
  echo "FAIL start: the source line and caret are"; tail -n 2 "$dir/err"; fail=1
fi

printf '# caf\xc3(\n' >"$dir/continuation.shm"
expect continuation 1 "" "continuation.shm:1:6: error: SyntaxError: (unicode error) 'utf-8' codec can't decode byte 0xc3 in position 5: invalid continuation byte"

printf 's = "\xed\xa0\x80"\n' >"$dir/surrogate.shm"
expect surrogate 1 "" "surrogate.shm:1:6: error: SyntaxError: (unicode error) 'utf-8' codec can't decode byte 0xed in position 5: invalid continuation byte"

printf 'print(1)\n# \xe6\x97' >"$dir/end.shm"
expect end 1 "" "end.shm:2:3: error: SyntaxError: (unicode error) 'utf-8' codec can't decode byte 0xe6 in position 11: unexpected end of data"

exit $fail
