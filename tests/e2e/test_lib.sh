#!/usr/bin/env bash
# The shell tests' helpers (tests/e2e/lib.sh) fail closed: an empty test, an empty value, a missing
# file, a malformed ckpt_diff line and an awk over empty input must all count as failures. Each
# case runs the helper in a subshell and looks at what it says and returns.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0 cases=0
# expect pass|fail "what" command...: runs the command in a subshell with a fresh failure count
expect() {
    local want=$1 what=$2 got
    shift 2
    cases=$((cases + 1))
    if (fails=0; "$@" >/dev/null 2>&1; r=$?; [ "$fails" -eq 0 ] && [ $r -eq 0 ]); then got=pass; else got=fail; fi
    if [ "$got" = "$want" ]; then echo "ok: $what ($got)"; else echo "WRONG: $what: $got, expected $want"; bad=$((bad + 1)); fi
}
d_ok="params max_abs 3e-07 max_rel 2e-05; optimizer max_abs 1e-06"
expect fail "check with an empty test" check "x" ""
expect fail "check with a blank test" check "x" "   "
expect pass "check with a true test" check "x" "true"
expect fail "check with a false test" check "x" "false"
# grep -q stops reading at its first match; the writer's SIGPIPE must not fail the check (it did
# under pipefail, at random under load), and a pipeline whose last command fails still fails
expect pass "check of a grep -q whose writer gets SIGPIPE" check "x" "seq 1 2000000 | grep -q '^1\$'"
expect fail "check of a pipeline whose grep finds nothing" check "x" "seq 1 10 | grep -q '^11\$'"
expect pass "check leaves pipefail as it was" bash -c 'source "$0"; set -o pipefail; check x true; [[ -o pipefail ]]' "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
expect fail "check of an awk over empty input (the old 2-replica check) via ckpt_close" ckpt_close "" 1e-4 1e-3
expect fail "ckpt_close of a malformed line" ckpt_close "ckpt_diff: the params groups differ" 1e-4 1e-3
expect pass "ckpt_close within tolerance" ckpt_close "$d_ok" 1e-4 1e-3
expect fail "ckpt_close over tolerance" ckpt_close "$d_ok" 1e-7 1e-3
expect fail "ckpt_close with a nan" ckpt_close "params max_abs nan max_rel nan; optimizer max_abs nan" 1e-4 1e-3
expect pass "ckpt_equal of identical files" ckpt_equal "params max_abs 0 max_rel 0; optimizer max_abs 0"
expect fail "ckpt_equal of an empty diff" ckpt_equal ""
expect fail "ckpt_equal of close files" ckpt_equal "$d_ok"
expect fail "same of two empty values" same "" ""
expect fail "same of a value and nothing" same "a" ""
expect pass "same of equal values" same "a b" "a b"
expect fail "same of different values" same "a" "b"
expect fail "is_num of empty" is_num ""
expect fail "is_num of text" is_num "loss"
expect fail "is_num of nan" is_num "nan"
expect pass "is_num of 1.5e-3" is_num "1.5e-3"
expect fail "num_lt with an empty left side" num_lt "" 1
expect fail "num_lt with an empty right side" num_lt 1 ""
expect fail "num_lt of two empties" num_lt "" ""
expect pass "num_lt 0.3 < 2" num_lt 0.3 2
expect fail "num_lt 2 < 0.3" num_lt 2 0.3
expect fail "num_gt of a whole log line (a sed that did not match)" num_gt '{"step": 1, "eval": 2}' 0.5
expect pass "num_gt 0.9 > 0.6" num_gt 0.9 0.6
expect pass "num_le 3 <= 3" num_le 3 3
expect fail "nonempty_file of a missing file" nonempty_file "$tmp/missing"
: >"$tmp/empty"
expect fail "nonempty_file of an empty file" nonempty_file "$tmp/empty"
echo x >"$tmp/full"
expect pass "nonempty_file of a file" nonempty_file "$tmp/full"
# finish exits 1 after a failed check, 0 after passed ones
(fails=0; check "a failing check" false >/dev/null; finish >/dev/null); r=$?
cases=$((cases + 1)); if [ $r -eq 1 ]; then echo "ok: finish exits 1 after a failed check"; else echo "WRONG: finish exited $r after a failed check"; bad=$((bad + 1)); fi
(fails=0; check "a passing check" true >/dev/null; finish >/dev/null); r=$?
cases=$((cases + 1)); if [ $r -eq 0 ]; then echo "ok: finish exits 0 after passing checks"; else echo "WRONG: finish exited $r"; bad=$((bad + 1)); fi
if [ $bad -ne 0 ] || [ $cases -lt 30 ]; then echo "test_lib.sh: $bad of $cases cases wrong"; exit 1; fi
echo "test_lib.sh: all $cases cases right"
