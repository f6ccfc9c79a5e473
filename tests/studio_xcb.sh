#!/usr/bin/env bash
# The studio's window tests on a real X server (Qt's xcb platform, not offscreen): geometry at a
# 1600x1000 and a 1024x700 screen, where only a real window shows whether the status bar is on
# screen and the canvas keeps its room. Usage: studio_xcb.sh TST_STUDIO
# Skipped (exit 77) where Xvfb is not installed, except under CI, where it must be
# (scripts/install-deps.sh installs it).
set -euo pipefail
tst_studio=$1
if ! command -v Xvfb >/dev/null; then
  if [ "${CI:-}" = true ]; then echo "Xvfb is not installed: run scripts/install-deps.sh" >&2; exit 1; fi
  echo "Xvfb is not installed (scripts/install-deps.sh installs it): skipped"
  exit 77
fi
work=$(mktemp -d)
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
geometry_tests=(
  the_window_fits_the_screen_and_remembers_its_layout
  small_windows_keep_every_panel_usable
  fit_keeps_node_text_readable_on_a_long_pipeline
  renders_the_window_with_a_running_pipeline_to_png
  a_fitted_pipeline_shows_every_node_and_its_numbers
  small_windows_keep_the_run_panels_readable
  new_resets_the_zoom_and_an_empty_canvas_says_how_to_start
)
for screen in 1600x1000 1024x700; do
  # -displayfd: the server picks a free display number and writes it when it is ready.
  : >"$work/display"
  Xvfb -displayfd 3 -screen 0 "${screen}x24" -nolisten tcp 3>"$work/display" 2>"$work/xvfb.log" &
  server=$!
  for _ in $(seq 100); do [ -s "$work/display" ] && break; sleep 0.1; done
  if [ ! -s "$work/display" ]; then echo "Xvfb did not start:" >&2; cat "$work/xvfb.log" >&2; exit 1; fi
  display=":$(head -n1 "$work/display")"
  echo "== screen $screen on $display"
  DISPLAY=$display QT_QPA_PLATFORM=xcb "$tst_studio" "${geometry_tests[@]}"
  kill "$server"; wait "$server" 2>/dev/null || true; server=""
done
