#!/usr/bin/env bash
# skipped-tests.sh LOG: list, from the output of `go test -v`, every test that
# skipped and the reason it gave.
#
# Why: without -v a skip is invisible, and a test that skips for want of a tool
# (pyarrow, python3, a broker) looks like one that passed. make prints this list
# after every run so that a skip is always seen. Each test's last line of output
# before its "--- SKIP" is taken as the reason (t.Skip's message), attributed as
# in failed-tests.sh by the latest "=== RUN", "=== CONT" or "=== NAME" line.
set -euo pipefail
log="${1:?usage: skipped-tests.sh LOG}"
awk '
/^=== (RUN|CONT|NAME)[ \t]/ { cur = $3; next }
/^=== PAUSE[ \t]/ { next }
/^(ok|FAIL|PASS)([ \t]|$)/ { cur = ""; next }
/^[ \t]*--- SKIP: / {
	name = $3
	reason = (name in last) ? last[name] : ""
	sub(/^[ \t]+/, "", reason)
	skipped[++n] = name (reason != "" ? "  (" reason ")" : "")
	next
}
/^[ \t]*--- (PASS|FAIL): / { next }
cur != "" && $0 ~ /[^ \t]/ { last[cur] = $0 }
END {
	if (n == 0) { print "== no test skipped"; exit }
	print "== " n " skipped test(s) (scripts/skipped-tests.sh):"
	for (i = 1; i <= n; i++) print "--- SKIP: " skipped[i]
}' "$log"
