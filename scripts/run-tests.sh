#!/usr/bin/env bash
# Runs every test binary, first as built, then under AddressSanitizer + UndefinedBehaviorSanitizer,
# and closes with one line counting cmocka's passed and failed tests over all of them.
set -u
cd "$(dirname "$0")/.."
passed=0 failed=0 skipped=0 broken=()
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
for dir in build/tests build/asan-tests; do
    for t in "$@"; do
        log=$(mktemp)
        # No test may wait for input or run away with CI's time: a hang fails after 15 minutes.
        timeout 900 "$dir/$t" >"$log" 2>&1 </dev/null
        rc=$?
        cat "$log"
        p=$(grep -oP '^\[  PASSED  \] \K[0-9]+' "$log" | tail -1)
        f=$(grep -oP '^\[  FAILED  \] \K[0-9]+(?= test)' "$log" | tail -1)
        s=$(grep -oP '^\[  SKIPPED \] \K[0-9]+(?= test)' "$log" | tail -1)
        passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0})); skipped=$((skipped + ${s:-0}))
        # A crash, a sanitizer report or a non-zero exit with no failed test counted is still a failure.
        if [ $rc -ne 0 ] && [ "${f:-0}" -eq 0 ]; then failed=$((failed + 1)); broken+=("$dir/$t (exit $rc)"); fi
        rm -f "$log"
    done
done
for b in "${broken[@]+"${broken[@]}"}"; do echo "broken: $b"; done
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
