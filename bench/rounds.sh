# What the bench scripts share (sourced): timing a quiet run, and the median and range of figures.
# Needs $sluice (the CLI) and $work (a scratch folder).

seconds() {  # the wall time of a quiet run of pipeline $1 (more sluice options after it)
  local start
  start=$(date +%s.%N)
  "$sluice" run -q "$@" > /dev/null 2> "$work/err" || { cat "$work/err" >&2; exit 1; }
  echo "$(date +%s.%N) - $start" | bc
}
median() { sort -g | awk '{ v[NR] = $1 } END { printf "%s", v[int((NR + 1) / 2)] }'; }  # of figures on stdin, one a line
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s-%s", lo, hi }'; }
