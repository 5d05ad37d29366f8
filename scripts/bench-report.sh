#!/usr/bin/env bash
# The bench report: runs the memory_bound, gemm and attention benches on this machine's GPU,
# each writing its JSON results into OUT (default target/tessera-bench), then renders
# OUT/report.html, a page per architecture (tessera-report html). With --ncu, Nsight Compute's
# DRAM/SM/tensor-pipe figures are collected for every memory_bound kernel (the bench run once
# more under ncu with TESSERA_BENCH_PROFILE=1: each row launches once) and merged into its
# results (tessera-report ncu). Compare two runs with
#   cargo run --release --bin tessera-report -- compare old/memory_bound-sm_90.json new/memory_bound-sm_90.json
#
# Usage: scripts/bench-report.sh [--ncu] [OUT]
# From a checkout the benches are built with cargo; where there is no Rust toolchain (the GPU
# machine), BENCH_BIN names a folder of prebuilt executables: memory_bound, gemm, attention,
# tessera-report (`cargo bench --no-run` and `cargo build --release --bin tessera-report`).
set -euo pipefail
cd "$(dirname "$0")/.."
ncu=0
if [ "${1:-}" = "--ncu" ]; then ncu=1; shift; fi
out=${1:-target/tessera-bench}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export TESSERA_BENCH_OUT=$out
if [ -z "${TESSERA_COMMIT:-}" ]; then
  TESSERA_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  export TESSERA_COMMIT
fi
bench() { # name: runs one bench, its tables into OUT/<name>.txt
  if [ -n "${BENCH_BIN:-}" ]; then
    "$BENCH_BIN/$1" --bench no-criterion-rows > "$out/$1.txt" 2>&1
  else
    cargo bench --bench "$1" -- no-criterion-rows > "$out/$1.txt" 2>&1
  fi
}
report() {
  if [ -n "${BENCH_BIN:-}" ]; then "$BENCH_BIN/tessera-report" "$@"; else cargo run -q --release --bin tessera-report -- "$@"; fi
}
for b in memory_bound gemm attention; do
  echo "bench $b → $out/$b.txt"
  bench "$b"
done
if [ "$ncu" = 1 ]; then
  metrics="dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
  exe=${BENCH_BIN:+$BENCH_BIN/memory_bound}
  if [ -z "$exe" ]; then
    exe=$(cargo bench --no-run --bench memory_bound --message-format json 2>/dev/null \
      | python3 -c 'import sys, json
for l in sys.stdin:
    j = json.loads(l)
    if j.get("reason") == "compiler-artifact" and j.get("executable") and j["target"]["name"] == "memory_bound": print(j["executable"])' | tail -1)
  fi
  echo "ncu over memory_bound → $out/ncu.csv"
  TESSERA_BENCH_PROFILE=1 TESSERA_BENCH_OUT=$(mktemp -d) ncu --csv --target-processes application-only --metrics "$metrics" \
    "$exe" --bench no-criterion-rows > "$out/ncu.csv" 2> "$out/ncu.err"
  arch_json=$(ls "$out"/memory_bound-sm_*.json | head -1)
  report ncu "$arch_json" "$out/ncu.csv"
fi
report html "$out"/*-sm_*.json -o "$out/report.html"
