#!/usr/bin/env bash
# On the GPU machine, from the unpacked .gpu folder (`bash sanitize.sh`, or `bash
# sanitize.sh bin/gpu_language` for some executables): the GPU test executables under each of
# compute-sanitizer's tools, then one line per tool — the kernels the runs loaded
# (TESSERA_LOG_KERNELS) and the errors found; each tool's full report goes to
# $OUT/sanitize-<tool>-<exe>.log (or logs/). SANITIZE_TIMEOUT (seconds per run, default 300)
# bounds a run: one cut short says so. SANITIZE_TOOLS picks tools; extra test-name filters go
# in SANITIZE_FILTER. SANITIZE_JOBS (default 1) runs that many (tool, executable) pairs at
# once on the one GPU: the tools slow kernels down far more than they load the GPU.
# SANITIZE_EACH=1 runs each test in a process of its own.
set -uo pipefail
cd "$(dirname "$0")"
[ -d bin ] || tar -xJf bin.tar.xz
logs="${OUT:-logs}"; mkdir -p "$logs"
export PATH="$PATH:/usr/local/cuda/bin" TESSERA_REQUIRE_GPU=1 TESSERA_LOG_KERNELS=1
exes=("$@"); [ ${#exes[@]} -gt 0 ] || exes=(bin/gpu_*)
tools=(${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck})

# One run: its log, and its exit status in <log>.rc. With SANITIZE_EACH=1, a process per
# test (racecheck has died in long processes that load many modules): the worst status.
run_one() {
  local tool=$1 exe=$2 log="$logs/sanitize-$1-$(basename "$2").log" rc worst=0
  local tests=("")
  # shellcheck disable=SC2086
  [ "${SANITIZE_EACH:-0}" = 1 ] && mapfile -t tests < <("$exe" --list ${SANITIZE_FILTER:-} 2>/dev/null | sed -n 's/: test$//p')
  : >"$log"
  for t in "${tests[@]}"; do
    # shellcheck disable=SC2086
    if [ -n "$t" ]; then set -- --exact "$t"; else set -- ${SANITIZE_FILTER:-}; fi
    timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --require-cuda-init=no --error-exitcode 9 "$exe" --test-threads=1 --nocapture "$@" >>"$log" 2>&1
    rc=$?
    # A cut-short or crashed run outranks a finding, a finding a pass.
    case $rc in
      0) ;;
      9) [ $worst -eq 0 ] && worst=9 ;;
      124) worst=124 ;;
      *) [ $worst -ne 124 ] && worst=$rc ;;
    esac
  done
  echo $worst >"$log.rc"
}

for tool in "${tools[@]}"; do
  for exe in "${exes[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "${SANITIZE_JOBS:-1}" ]; do wait -n; done
    run_one "$tool" "$exe" &
  done
done
wait

lines=()
for tool in "${tools[@]}"; do
  errors=0; cut=(); other=(); all=""
  for exe in "${exes[@]}"; do
    log="$logs/sanitize-$tool-$(basename "$exe").log"
    rc=$(cat "$log.rc" 2>/dev/null || echo 1)
    [ "$rc" -eq 124 ] && cut+=("$(basename "$exe")")
    [ "$rc" -ne 0 ] && [ "$rc" -ne 9 ] && [ "$rc" -ne 124 ] && other+=("$(basename "$exe") rc=$rc")
    n=$(grep -Eo '(ERROR|RACECHECK) SUMMARY: [0-9]+' "$log" | grep -Eo '[0-9]+$' | awk '{s += $1} END {print s + 0}')
    errors=$((errors + ${n:-0}))
    all+="$(grep -Eo 'tessera: loading kernel [^ ]+' "$log" | awk '{print $4}')"$'\n'
    rm -f "$log.rc"
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
