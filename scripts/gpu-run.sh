#!/usr/bin/env bash
# Runs on the GPU machine: every GPU test executable with TESSERA_REQUIRE_GPU=1, the ptxas
# check with the machine's ptxas, the quickstart and the benches; prints a summary table last.
# Logs go to $OUT (or .gpu/logs).
set -uo pipefail
cd "$(dirname "$0")"
[ -d bin ] || tar -xJf bin.tar.xz
logs="${OUT:-logs}"; mkdir -p "$logs"
export PATH="$PATH:/usr/local/cuda/bin" TESSERA_REQUIRE_GPU=1
summary=()
mkdir -p "$logs/sass"; export TESSERA_SASS_DIR="$logs/sass"
for t in bin/gpu_* bin/ptxas; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  "$t" --test-threads=1 >"$logs/$name.log" 2>&1; rc=$?
  line=$(grep -E '^test result:' "$logs/$name.log" | tail -1)
  summary+=("$(printf '%-16s rc=%-3s %s' "$name" "$rc" "${line:-no result}")")
  [ $rc -eq 0 ] || grep -E 'panicked|FAILED|failed' "$logs/$name.log" | head -20
done
# The GEMM's machine code must use the tensor cores (HGMMA) and the TMA engine (UTMALDG).
if [ -f "$logs/sass/gemm_tn_bf16__bn256_stages4.sm_90a.cubin" ] && command -v cuobjdump >/dev/null; then
  sass=$(cuobjdump -sass "$logs/sass/gemm_tn_bf16__bn256_stages4.sm_90a.cubin")
  summary+=("$(printf 'sass gemm_tn_bf16 default HGMMA=%s UTMALDG=%s' "$(grep -c HGMMA <<<"$sass")" "$(grep -c UTMALDG <<<"$sass")")")
fi
rm -rf "$logs/sass"
if [ "${SANITIZE:-0}" = 1 ]; then
  # compute-sanitizer's four tools over the GPU tests: one line per tool (sanitize.sh).
  while IFS= read -r l; do summary+=("sanitize $l"); done < <(bash sanitize.sh)
fi
if [ -x bin/quickstart ]; then bin/quickstart 2>&1 | tee "$logs/quickstart.log"; summary+=("$(printf '%-16s rc=%s' quickstart "${PIPESTATUS[0]}")"); fi
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -x bin/memory_bound ]; then
  bin/memory_bound --bench >"$logs/memory_bound.log" 2>&1
  sed -n '/^memory_bound on/,$p' "$logs/memory_bound.log"
fi
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -x bin/gemm ]; then
  bin/gemm --bench >"$logs/gemm.log" 2>&1
  sed -n '/^gemm bf16 on/,$p' "$logs/gemm.log"
fi
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -x bin/attention ]; then
  TESSERA_CUDNN_SCRIPT=bin/attention_cudnn.py bin/attention --bench >"$logs/attention.log" 2>&1
  sed -n '/^attention bf16 forward on/,$p' "$logs/attention.log"
fi
echo; echo "== summary"; printf '%s\n' "${summary[@]}"
