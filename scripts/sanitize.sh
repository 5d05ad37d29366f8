#!/usr/bin/env bash
# On the GPU machine, from the unpacked .gpu folder (`bash sanitize.sh`, or `bash
# sanitize.sh bin/gpu_language` for some executables): the GPU test executables under each of
# compute-sanitizer's tools, then one line per tool — the kernels the runs loaded
# (TESSERA_LOG_KERNELS) and the errors found; each tool's full report goes to
# $OUT/sanitize-<tool>-<exe>.log (or logs/). SANITIZE_TIMEOUT (seconds per run, default 300)
# bounds a run: one cut short says so. SANITIZE_TOOLS picks tools; extra test-name filters go
# in SANITIZE_FILTER.
set -uo pipefail
cd "$(dirname "$0")"
[ -d bin ] || tar -xJf bin.tar.xz
logs="${OUT:-logs}"; mkdir -p "$logs"
export PATH="$PATH:/usr/local/cuda/bin" TESSERA_REQUIRE_GPU=1 TESSERA_LOG_KERNELS=1
exes=("$@"); [ ${#exes[@]} -gt 0 ] || exes=(bin/gpu_*)
lines=()
for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
  errors=0; cut=(); other=(); all=""
  for exe in "${exes[@]}"; do
    log="$logs/sanitize-$tool-$(basename "$exe").log"
    # shellcheck disable=SC2086
    timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$exe" --test-threads=1 --nocapture ${SANITIZE_FILTER:-} >"$log" 2>&1
    rc=$?
    [ $rc -eq 124 ] && cut+=("$(basename "$exe")")
    [ $rc -ne 0 ] && [ $rc -ne 9 ] && [ $rc -ne 124 ] && other+=("$(basename "$exe") rc=$rc")
    n=$(grep -Eo '(ERROR|RACECHECK) SUMMARY: [0-9]+' "$log" | grep -Eo '[0-9]+$' | awk '{s += $1} END {print s + 0}')
    errors=$((errors + ${n:-0}))
    all+="$(grep -Eo 'tessera: loading kernel [^ ]+' "$log" | awk '{print $4}')"$'\n'
  done
  kernels=$(printf '%s' "$all" | sed '/^$/d' | sort -u)
  count=$(printf '%s\n' "$kernels" | sed '/^$/d' | wc -l)
  printf '%s\n' "$kernels" > "$logs/sanitize-$tool-kernels.txt"
  line=$(printf '%-10s kernels %-4s errors %-4s' "$tool" "$count" "$errors")
  [ ${#cut[@]} -gt 0 ] && line+=" cut short by SANITIZE_TIMEOUT: ${cut[*]}"
  [ ${#other[@]} -gt 0 ] && line+=" failed: ${other[*]}"
  lines+=("$line")
done
printf '%s\n' "${lines[@]}"
