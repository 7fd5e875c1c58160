#!/usr/bin/env bash
# failed-tests.sh LOG: print, from the output of `go test -v`, what each failing
# test itself printed, after everything else.
#
# Why: CI shows the end of a run's output. With -v, a test's messages stream
# while it runs and the packages after it keep printing, so the reason a test
# failed can be hundreds of lines above the end. This repeats those lines last.
# Each test's output is attributed to the test named by the latest "=== RUN",
# "=== CONT" or "=== NAME" line, as `go test -v` announces them; at most the last
# MAX_LINES (default 60) lines of each failing test are shown.
#
# Two failures name no test, and are printed too. The race detector's reports, whole
# (up to MAX_RACES, default 3): a race in a goroutine that outlives its test fails the
# package ("race detected outside of test execution") with every test passed. And the
# runtime's "fatal error:" (concurrent map writes, a deadlock), which ends the test
# binary mid-test: its first MAX_LINES lines, the failing goroutine's stack first.
set -euo pipefail
log="${1:?usage: failed-tests.sh LOG}"
awk -v max="${MAX_LINES:-60}" -v maxraces="${MAX_RACES:-3}" '
/^WARNING: DATA RACE$/ { inrace = 1; races++ }
inrace {
	if (races <= maxraces) race[++nrace] = $0
	if ($0 ~ /^==================$/) { inrace = 0; if (races <= maxraces) race[++nrace] = "" }
	next
}
/race detected outside of test execution/ { found = $0 }
/^fatal error: / { fatal = 1 }
fatal && nfatal < max { fat[++nfatal] = $0 }
/^=== (RUN|CONT|NAME)[ \t]/ { cur = $3; next }
/^=== PAUSE[ \t]/ { next }
/^(ok|FAIL|PASS)([ \t]|$)/ { cur = ""; next }
/^[ \t]*--- FAIL: / {
	name = $3
	if (!(name in failed)) { failed[name] = 1; order[++n] = name }
	next
}
/^[ \t]*--- (PASS|SKIP): / { next }
cur != "" {
	k = ++count[cur]
	lines[cur, k] = $0
	if (k > max) delete lines[cur, k - max]
}
END {
	if (nrace > 0) {
		print ""
		print "== data races (scripts/failed-tests.sh; " races " report(s), the first " (races < maxraces ? races : maxraces) " shown)"
		if (found != "") print found
		for (k = 1; k <= nrace; k++) print race[k]
	}
	if (nfatal > 0) {
		print ""
		print "== the test binary crashed (scripts/failed-tests.sh; first " max " lines from its fatal error)"
		for (k = 1; k <= nfatal; k++) print fat[k]
	}
	if (n == 0) exit
	print ""
	print "== what the failing tests printed (scripts/failed-tests.sh; last " max " lines each)"
	for (i = 1; i <= n; i++) {
		name = order[i]
		print "--- FAIL: " name
		from = count[name] > max ? count[name] - max + 1 : 1
		for (k = from; k <= count[name]; k++) print lines[name, k]
	}
}' "$log"
