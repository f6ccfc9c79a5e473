#!/usr/bin/env bash
# A third party writing plugins: install Sluice to a fresh prefix, scaffold a plugin of every kind
# with the installed `sluice new-plugin`, build each against the installed SDK only (nothing from
# the source or build tree on its compile lines), run the test each project carries, list it with
# `sluice plugins --plugin-dir`, run the pipeline its README shows, and find it in the studio's
# palette (offscreen). The templates' own tests and READMEs are what is exercised, so they cannot
# rot. Usage: plugin_authoring.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build_dir=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "plugin authoring: $*" >&2
  exit 1
}

# Installed in one place and moved to another: the prefix is relocatable (the CLI finds its
# plugins beside it, the CMake package its files beside it).
cmake --install "$build_dir" --prefix "$work/installed_here" > "$work/install.log" || fail "cmake --install failed: $(tail -5 "$work/install.log")"
mv "$work/installed_here" "$work/prefix"
prefix=$work/prefix
sluice=$prefix/bin/sluice
[ -x "$sluice" ] || fail "the install has no bin/sluice"
[ -f "$prefix/include/sluice/testing.hpp" ] || fail "the install has no SDK test harness (include/sluice/testing.hpp)"
[ -f "$prefix/share/doc/sluice/plugin-guide.md" ] || fail "the install has no plugin guide (share/doc/sluice/plugin-guide.md)"
# The installed CLI finds the installed plugins by itself (a relocatable prefix).
SLUICE_PLUGIN_PATH= "$sluice" plugins range > /dev/null || fail "the installed sluice does not find its bundled plugins"

cd "$work"
for kind in source map filter expand aggregate sink; do
  name=my_$kind
  "$sluice" new-plugin "$name" --kind "$kind" > "$work/$kind.log" || fail "new-plugin --kind $kind failed: $(cat "$work/$kind.log")"
  for file in CMakeLists.txt "$name.hpp" "$name.cpp" "${name}_test.cpp" README.md pipeline.txtpb; do
    [ -f "$name/$file" ] || fail "new-plugin --kind $kind wrote no $file"
  done
  # The README's own commands (its "Build and test" block, P being the prefix): configure, build, test.
  awk '/^## Build and test/ {on = 1} on && /^```sh/ {block = 1; next} block && /^```/ {exit} block' "$name/README.md" |
    sed "s#PREFIX_PATH=P\$#PREFIX_PATH=$prefix -DCMAKE_EXPORT_COMPILE_COMMANDS=ON#" > "$work/$kind.steps"
  [ "$(wc -l < "$work/$kind.steps")" -ge 3 ] && grep -q "ctest" "$work/$kind.steps" || fail "$kind: the README has no build-and-test commands: $(cat "$work/$kind.steps")"
  (cd "$name" && bash -e "$work/$kind.steps") >> "$work/$kind.log" 2>&1 || fail "$kind: the README's commands failed: $(tail -30 "$work/$kind.log")"
  if grep -q -e "$source_dir" -e "$build_dir" "$name/build/compile_commands.json"; then
    fail "$kind: its compile lines reach into the source or build tree: $(grep -o -e "$source_dir[^ \"]*" -e "$build_dir[^ \"]*" "$name/build/compile_commands.json" | head -3)"
  fi
  grep -q "100% tests passed" "$work/$kind.log" || fail "$kind: the project's own test did not pass: $(tail -20 "$work/$kind.log")"
  [ -f "$name/build/lib$name.so" ] || fail "$kind: no lib$name.so where its README says"
  # Listed, with its parameters, from the folder given.
  SLUICE_PLUGIN_PATH= "$sluice" plugins "$name" --plugin-dir "$name/build" > "$work/$kind.plugins" 2>&1 || fail "$kind: sluice plugins $name: $(cat "$work/$kind.plugins")"
  grep -q "$kind" "$work/$kind.plugins" || fail "$kind: sluice plugins does not show its kind: $(cat "$work/$kind.plugins")"
  # The pipeline its README shows, run with the installed CLI.
  SLUICE_PLUGIN_PATH= "$sluice" run -q "$name/pipeline.txtpb" --plugin-dir "$name/build" > "$work/$kind.run" 2>&1 || fail "$kind: its pipeline failed: $(tail -20 "$work/$kind.run")"
  grep -q "$(sed -n 2p "$name/pipeline.txtpb")" "$name/README.md" || fail "$kind: the README does not show the pipeline it ships"
done

# What each pipeline made: the operators did their work through the engine.
expect() {
  [ "$(cat "$1")" = "$2" ] || fail "$1 holds $(cat "$1" | tr '\n' ' '), expected $(echo "$2" | tr '\n' ' ')"
}
expect my_source/out.jsonl $'{"value":0,"square":0}\n{"value":1,"square":1}\n{"value":2,"square":4}\n{"value":3,"square":9}\n{"value":4,"square":16}'
expect my_map/out.jsonl $'{"value":0}\n{"value":3}\n{"value":6}\n{"value":9}\n{"value":12}'
expect my_filter/out.jsonl $'{"value":0}\n{"value":3}\n{"value":6}\n{"value":9}'
expect my_expand/out.jsonl $'{"value":0,"copy":0}\n{"value":0,"copy":1}\n{"value":1,"copy":0}\n{"value":1,"copy":1}\n{"value":2,"copy":0}\n{"value":2,"copy":1}'
expect my_aggregate/out.jsonl $'{"value":6,"count":4}\n{"value":22,"count":4}\n{"value":17,"count":2}'
expect my_sink/out.txt $'0\n1\n2\n3\n4'

# All six at once beside the bundled ones, and one in the studio's palette.
dirs=()
for kind in source map filter expand aggregate sink; do dirs+=(--plugin-dir "my_$kind/build"); done
SLUICE_PLUGIN_PATH= "$sluice" plugins "${dirs[@]}" > "$work/all.plugins" 2>&1 || fail "sluice plugins with all six: $(cat "$work/all.plugins")"
for kind in source map filter expand aggregate sink; do grep -q "my_$kind" "$work/all.plugins" || fail "my_$kind missing from sluice plugins"; done
if [ -x "$prefix/bin/sluice-studio" ]; then
  QT_QPA_PLATFORM=offscreen SLUICE_PLUGIN_PATH= "$prefix/bin/sluice-studio" --list-palette --plugin-dir my_map/build > "$work/palette" 2> "$work/palette.err" ||
    fail "the studio could not list its palette: $(cat "$work/palette.err")"
  grep -qx "my_map / maps / my_map" "$work/palette" || fail "my_map is not in the studio's palette: $(head -5 "$work/palette")"
fi

# Misuse is refused with a reason and exit code 2, and leaves nothing behind.
set +e
"$sluice" new-plugin batch --kind map > /dev/null 2> "$work/clash.err"; clash=$?
"$sluice" new-plugin My-Op --kind map > /dev/null 2> "$work/name.err"; badname=$?
"$sluice" new-plugin my_map --kind map > /dev/null 2> "$work/exists.err"; exists=$?
set -e
[ "$clash" = 2 ] && grep -q "an operator named 'batch' exists already" "$work/clash.err" || fail "a name clash was not refused: $(cat "$work/clash.err")"
[ "$badname" = 2 ] && grep -q "is not usable" "$work/name.err" || fail "a bad name was not refused: $(cat "$work/name.err")"
[ "$exists" = 2 ] && grep -q "exists and is not an empty folder" "$work/exists.err" || fail "an existing folder was not refused: $(cat "$work/exists.err")"
[ ! -e batch ] && [ ! -e My-Op ] || fail "a refused new-plugin left a folder behind"
echo "plugin authoring: six kinds scaffolded, built against the installed SDK, tested, listed, run and found in the palette: ok"
