#!/usr/bin/env bash
# Leak check of Tessera's PJRT bindings: runs the small program
# runtime/examples/pjrt_lifecycle.rs (plugin, client, buffers of every dtype
# in and out, compile, execute twice, free) under valgrind and fails if
# anything is definitely or indirectly lost, or if any leak record was
# allocated by Tessera code (the first frame above the allocator is a
# runtime, kernel_ir or pjrt_lifecycle function). What remains ("possibly
# lost", allocated inside the plugin) belongs to the plugin's
# process-lifetime singletons, whatever Tessera frame called into it.
#
# The example is the one `cargo test --workspace` builds (dev profile, no
# second build of the workspace in release), its debug info stripped into a
# copy: valgrind 3.19 cannot read DWARF 5, and the symbol table it keeps
# names every Tessera frame.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v valgrind >/dev/null 2>&1; then
  echo "leaks: skipped, valgrind is not installed (.ci/setup.sh installs it)"
  exit 0
fi
# --workspace: the feature set `cargo test --workspace` built it with, so this
# finds it fresh after the tests.
cargo build --quiet --workspace --example pjrt_lifecycle
mkdir -p target/leaks
program=target/leaks/pjrt_lifecycle
objcopy --strip-debug target/debug/examples/pjrt_lifecycle "$program.partial"
mv "$program.partial" "$program"
report=target/leaks/valgrind.txt
valgrind --leak-check=full --num-callers=40 "$program" >"$report" 2>&1
grep -q "pjrt lifecycle: ok" "$report" || { cat "$report"; echo "leaks: the program failed"; exit 1; }
definitely=$(grep -oP 'definitely lost: \K[0-9,]+' "$report" | tr -d ,)
indirectly=$(grep -oP 'indirectly lost: \K[0-9,]+' "$report" | tr -d ,)
# Per loss record, skip the allocator's frames (malloc and friends, Rust's
# alloc/core/std and hashbrown wrappers); the first frame left allocated it.
# Frames are judged by the path their function name starts with (a leading
# `<` of a trait impl dropped), so `<runtime::X as core::ops::Drop>::drop`
# is Tessera's and `<alloc::raw_vec::RawVecInner>::grow` the allocator's.
ours=$(awk '
  /are (definitely|indirectly|possibly) lost in loss record/ { rec = 1; first = 1; next }
  /^==[0-9]+== $/ { rec = 0; next }
  rec && first && /(at|by) 0x[0-9A-Fa-f]+: / {
    name = $0
    sub(/^.*(at|by) 0x[0-9A-Fa-f]+: </, "", name)
    sub(/^.*(at|by) 0x[0-9A-Fa-f]+: /, "", name)
    if (name ~ /^(malloc|calloc|realloc|memalign|posix_memalign|operator new|__rust_|__rdl_|__rustc::|alloc::|core::|std::|hashbrown::)/) next
    first = 0
    if (name ~ /^(runtime|kernel_ir|pjrt_lifecycle)::/) n++
  }
  END { print n + 0 }' "$report")
named=$(grep -c '(runtime|kernel_ir|pjrt_lifecycle)::' -E "$report" || true)
echo "leaks: definitely lost ${definitely:-?} bytes, indirectly lost ${indirectly:-?} bytes, leak records allocated by Tessera code: $ours (report: $report)"
# A report without one Tessera frame name means the symbols were lost and
# the check above saw nothing.
[ "$named" -gt 0 ] || { echo "leaks: no Tessera frame is named in the report: symbols missing, the check is blind"; exit 1; }
[ "${definitely:-1}" = 0 ] && [ "${indirectly:-1}" = 0 ] && [ "$ours" = 0 ]
