#!/usr/bin/env bash
# The one test command (`npm test`): type check, lint, every vitest suite, the Deno.test suite, and
# one closing line that sums them all: `N passed, N failed, N skipped`. Exits non-zero when
# anything failed or a suite could not run at all.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -d node_modules ] || npm install --no-audit --no-fund

OUT=.test-tmp
mkdir -p "$OUT"
rm -f "$OUT/vitest.json" "$OUT/deno.txt"
status=0
passed=0 failed=0 skipped=0

echo "== type check (tsc)"
if ! node_modules/.bin/tsc --noEmit -p tsconfig.json; then
  echo "type check failed"; failed=$((failed + 1)); status=1
fi

echo "== lint (deno lint: src, test, bench)"
if ! node_modules/.bin/deno lint; then
  echo "lint failed"; failed=$((failed + 1)); status=1
fi

echo "== vitest"
node_modules/.bin/vitest run --reporter=default --reporter=json --outputFile.json="$OUT/vitest.json" "$@" || status=1
if [ -s "$OUT/vitest.json" ]; then
  read -r p f s < <(node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    // A file that fails to load has no tests, and one whose beforeAll fails reports its tests as
    // skipped: count those as failures so they cannot hide.
    let broken = 0, hidden = 0;
    for (const t of r.testResults) {
      if (t.status !== "failed" || t.assertionResults.some((a) => a.status === "failed")) continue;
      const notRun = t.assertionResults.filter((a) => a.status !== "passed").length;
      broken += Math.max(1, notRun);
      hidden += notRun;
    }
    console.log(r.numPassedTests, r.numFailedTests + broken, r.numPendingTests + r.numTodoTests - hidden);
  ' "$OUT/vitest.json")
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
else
  echo "vitest produced no report"; failed=$((failed + 1)); status=1
fi

echo "== deno test"
NO_COLOR=1 DENO_NO_UPDATE_CHECK=1 node_modules/.bin/deno test -A --v8-flags=--expose-gc test/runtime/deno/ 2>&1 | tee "$OUT/deno.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
summary=$(grep -E '^(ok|FAILED) \| [0-9]+ passed' "$OUT/deno.txt" | tail -1)
if [ -n "$summary" ]; then
  p=$(sed -E 's/.*\| ([0-9]+) passed.*/\1/' <<<"$summary")
  f=$(sed -E 's/.*\| ([0-9]+) failed.*/\1/' <<<"$summary")
  i=$(grep -oE '[0-9]+ ignored' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + i))
else
  echo "deno test produced no summary"; failed=$((failed + 1)); status=1
fi

[ "$failed" -eq 0 ] || status=1
echo "$passed passed, $failed failed, $skipped skipped"
exit "$status"
