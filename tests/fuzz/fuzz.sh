#!/bin/bash
# tests/fuzz/fuzz.sh SRCDIR OUTDIR "CFLAGS" "LIBS" [SECONDS] - builds the
# libFuzzer target tests/fuzz/fuzz_eval.c with clang (AddressSanitizer and
# UndefinedBehaviorSanitizer, every source of src/ but cli/main.c) into
# OUTDIR/fuzz_eval, and, with SECONDS, runs it that long from a corpus of
# the language tests and examples.  `make fuzz` calls it with the flags
# configure found; FUZZ_SECONDS sets SECONDS there.
#
# Exit status: 0 when it built (and the run found nothing), else libFuzzer's.
set -eu
srcdir=$1 out=$2 cflags=$3 libs=$4 seconds=${5:-0}
command -v clang >/dev/null || { echo "fuzz: clang is not installed (apt-get install clang)"; exit 1; }
mkdir -p "$out/obj"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
flags="-std=gnu11 -O1 -g -ffp-contract=off -pthread -I$srcdir/src $cflags \
  -DSHMAP_STDLIB_DIR=\"$srcdir/stdlib\" -DSHMAP_SRC_STDLIB_DIR=\"$srcdir/stdlib\" \
  -DSHMAP_VERSION=\"fuzz\""
objs=()
for c in "$srcdir"/src/*/*.c "$srcdir/tests/fuzz/fuzz_eval.c"; do
  [ "$c" = "$srcdir/src/cli/main.c" ] && continue
  o="$out/obj/$(basename "$(dirname "$c")")_$(basename "$c" .c).o"
  if [ ! -e "$o" ] || [ "$c" -nt "$o" ]; then
    # shellcheck disable=SC2086 # the flag strings are word lists
    clang $flags $san -fsanitize=fuzzer-no-link -c "$c" -o "$o"
  fi
  objs+=("$o")
done
# shellcheck disable=SC2086
clang $san -fsanitize=fuzzer -pthread "${objs[@]}" $libs -o "$out/fuzz_eval"
echo "fuzz: built $out/fuzz_eval"
[ "$seconds" -gt 0 ] || exit 0
corpus="$out/corpus"
mkdir -p "$corpus"
# the tests' programs, and every input that once crashed it (regressions/)
cp "$srcdir"/tests/lang/*.shm "$srcdir"/examples/*.shm "$srcdir"/tests/fuzz/regressions/*.shm "$corpus"/
cd "$out"
# Leaks are checked by the sanitizer builds of `make check`; here a run is
# bounded in time, memory and per input.
ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
  ./fuzz_eval -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -seed="${FUZZ_SEED:-1}" \
  -max_len=4096 -print_final_stats=1 "$corpus"
