#!/usr/bin/env bash
# A third party's view: install Sluice, build resources/plugin_template against the installed SDK
# with find_package(Sluice), and run a pipeline that uses its operator with the installed CLI.
set -euo pipefail
build_dir=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$source_dir/resources/plugin_template" -B "$work/plugin" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/plugin" > "$work/build.log"
mkdir "$work/plugins"
cp "$work/plugin/libexample_plugin.so" "$work/plugins/"
"$work/prefix/bin/sluice" plugins example_scale --plugin-dir "$work/plugins" | grep -q "multiplier"
# Runs the pipeline on stdin with the installed CLI and the plugin; its jsonl_sink writes
# $work/out.jsonl, which must hold the lines given.
run_expecting() {
  cat > "$work/p.txtpb"
  rm -f "$work/out.jsonl"
  SLUICE_PLUGIN_PATH="$work/plugins" "$work/prefix/bin/sluice" run "$work/p.txtpb" > /dev/null
  if [ "$(cat "$work/out.jsonl")" != "$1" ]; then
    echo "unexpected output of $(grep -o 'example_[a-z]*' "$work/p.txtpb" | head -1):"; cat "$work/out.jsonl"; exit 1
  fi
}
run_expecting $'{"value":0}\n{"value":3}\n{"value":6}\n{"value":9}' <<PIPE
stage { id: "src" op: "range" params { key: "count" value: "4" } }
stage { id: "x3" op: "example_scale" input: "src" params { key: "factor" value: "3" } }
stage { id: "out" op: "jsonl_sink" input: "x3" params { key: "path" value: "$work/out.jsonl" } }
PIPE
# Its combine operator, reading two inputs.
run_expecting $'{"value":0}\n{"value":10}\n{"value":1}\n{"value":11}\n{"value":2}\n{"value":12}' <<PIPE
stage { id: "a" op: "range" params { key: "count" value: "3" } }
stage { id: "b" op: "range" params { key: "count" value: "5" } params { key: "start" value: "10" } }
stage { id: "both" op: "example_alternate" input: "a" input: "b" }
stage { id: "out" op: "jsonl_sink" input: "both" params { key: "path" value: "$work/out.jsonl" } }
PIPE
echo "external plugin built with find_package(Sluice) and run: ok"

# The installed Python package: `import sluice` from the prefix's dist-packages finds the
# installed plugins by itself, and the third party's plugin joins sluice.data with plugin_dirs.
python=${SLUICE_PYTHON:-/usr/bin/python3}
package=$(find "$work/prefix" -path '*/dist-packages/sluice/__init__.py' | head -1)
if [ -n "$package" ]; then
  site=$(dirname "$(dirname "$package")")
  (cd "$work" && PYTHONPATH="$site" SLUICE_PLUGIN_PATH="$work/plugins" "$python" -c "
import sluice
assert sluice.__file__.startswith('$work/prefix'), sluice.__file__
values = [int(v) for b in sluice.data.range(count=4).example_scale(factor=3).batch(batch_size=2) for v in b['value']]
assert values == [0, 3, 6, 9], values
print('installed python package imported and run: ok')
")
else
  echo "no Python package in the install (a sanitizer build has none): not tried"
fi
