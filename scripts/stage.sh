# Sourced by the build, test and CI scripts: `stage NAME COMMAND...` runs the command, says how
# long it took and returns its exit status; with SLUICE_STAGE_LOG naming a file, the time is also
# appended there, for the summary .ci/run prints at its end.
stage() {
  local name=$1 start took status=0
  shift
  start=$(date +%s)
  "$@" || status=$?
  took=$(( $(date +%s) - start ))
  [ "$status" -eq 0 ] || name="$name (failed: exit $status)"
  echo "== $name: ${took} s"
  if [ -n "${SLUICE_STAGE_LOG:-}" ]; then printf '%-52s %6d s\n' "$name" "$took" >> "$SLUICE_STAGE_LOG"; fi
  return "$status"
}
