#!/usr/bin/env bash
# Leak check of Tessera's PJRT bindings: runs the small program
# runtime/examples/pjrt_lifecycle.rs (plugin, client, buffers of every dtype
# in and out, compile, execute twice, free) under valgrind and fails if
# anything is definitely or indirectly lost, or if any leak record has a
# Tessera frame in its stack. What remains ("possibly lost", "still
# reachable") belongs to the plugin's process-lifetime singletons.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v valgrind >/dev/null 2>&1; then
  echo "leaks: skipped, valgrind is not installed (.ci/setup.sh installs it)"
  exit 0
fi
cargo build --quiet --release -p tessera-runtime --example pjrt_lifecycle
report=target/leaks/valgrind.txt
mkdir -p target/leaks
valgrind --leak-check=full --num-callers=40 target/release/examples/pjrt_lifecycle >"$report" 2>&1
grep -q "pjrt lifecycle: ok" "$report" || { cat "$report"; echo "leaks: the program failed"; exit 1; }
definitely=$(grep -oP 'definitely lost: \K[0-9,]+' "$report" | tr -d ,)
indirectly=$(grep -oP 'indirectly lost: \K[0-9,]+' "$report" | tr -d ,)
ours=$(awk '/are (definitely|indirectly|possibly) lost in loss record/ {rec=1} rec && /(runtime|kernel_ir|pjrt_lifecycle)::/ {n++} /^==[0-9]+== $/ {rec=0} END {print n+0}' "$report")
echo "leaks: definitely lost ${definitely:-?} bytes, indirectly lost ${indirectly:-?} bytes, leak records in Tessera code: $ours (report: $report)"
[ "${definitely:-1}" = 0 ] && [ "${indirectly:-1}" = 0 ] && [ "$ours" = 0 ]
