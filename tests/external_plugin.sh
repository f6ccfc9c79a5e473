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

# A program embedding the engine: find_package(Sluice COMPONENTS core), Sluice::core, the bundled
# plugins of the prefix, a pipeline run in-process with the third party's operator in it.
mkdir "$work/embed"
cat > "$work/embed/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(embed LANGUAGES CXX)
find_package(Sluice REQUIRED COMPONENTS core)
add_executable(embed embed.cpp)
target_link_libraries(embed PRIVATE Sluice::core)
CMAKE
cat > "$work/embed/embed.cpp" <<'CPP'
#include <cstdio>
#include "sluice/core/engine.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"
int main(int argc, char** argv) {
  sluice::Registry registry;
  registry.load_search_path({argv[1], argv[2]});
  const std::string text = std::string("stage { id: \"src\" op: \"range\" params { key: \"count\" value: \"5\" } }\n") +
                           "stage { id: \"x3\" op: \"example_scale\" input: \"src\" params { key: \"factor\" value: \"3\" } }\n" +
                           "stage { id: \"out\" op: \"jsonl_sink\" input: \"x3\" params { key: \"path\" value: \"" + argv[3] + "\" } }\n";
  sluice::Engine engine(sluice::build_graph(sluice::parse_pipeline(text, "embedded"), registry));
  engine.start();
  const auto result = engine.wait();
  std::printf("%s\n", result.state == sluice::RunState::Finished ? "finished" : result.error.c_str());
  return result.state == sluice::RunState::Finished ? 0 : 1;
}
CPP
cmake -S "$work/embed" -B "$work/embed/build" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/embed.log" 2>&1 || { tail -20 "$work/embed.log"; exit 1; }
cmake --build "$work/embed/build" >> "$work/embed.log" 2>&1 || { tail -30 "$work/embed.log"; exit 1; }
rm -f "$work/out.jsonl"
SLUICE_PLUGIN_PATH= "$work/embed/build/embed" "$work/prefix/lib/sluice/plugins" "$work/plugins" "$work/out.jsonl" > /dev/null
if [ "$(cat "$work/out.jsonl")" != $'{"value":0}\n{"value":3}\n{"value":6}\n{"value":9}\n{"value":12}' ]; then
  echo "the embedded engine wrote:"; cat "$work/out.jsonl"; exit 1
fi
echo "engine embedded with find_package(Sluice COMPONENTS core) and run: ok"

# The installed Python package: `import sluice` from the prefix's dist-packages finds the
# installed plugins by itself, and the third party's plugin joins sluice.data with plugin_dirs.
python=${SLUICE_PYTHON:-/usr/bin/python3}
package=$(find "$work/prefix" -path '*/dist-packages/sluice/__init__.py' | head -1)
if [ -n "$package" ]; then
  site=$(dirname "$(dirname "$package")")
  (cd "$work" && PYTHONPATH="$site" SLUICE_PLUGIN_PATH="$work/plugins" "$python" -c "
import sluice
assert sluice.__file__.startswith('$work/prefix'), sluice.__file__
values = [int(v) for b in sluice.data.range(count=4).example_scale(factor=3).batch(batch_size=2) for v in b]  # range's scalars, batched
assert values == [0, 3, 6, 9], values
print('installed python package imported and run: ok')
")
else
  echo "no Python package in the install (a sanitizer build has none): not tried"
fi
