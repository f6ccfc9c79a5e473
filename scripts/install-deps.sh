#!/usr/bin/env bash
# Installs the Debian packages Sluice builds and tests with; the one list shared by the README,
# scripts/test.sh, scripts/demo.sh and CI. Skips what is already installed. Then the peers
# environment (below), unless SLUICE_PEERS=0.
set -euo pipefail
cd "$(dirname "$0")/.."  # the requirements files and BUILD_DIR are taken from the repository root

packages=(
  build-essential cmake ninja-build pkg-config
  qt6-base-dev                 # Qt 6 Widgets, Network and Test (app and test suites)
  qt6-charts-dev libqt6opengl6-dev  # the studio's charts (Qt Charts needs Qt OpenGL's CMake files)
  libgraphviz-dev              # the studio's canvas layout (Graphviz's dot)
  xvfb                         # the studio's window tests on a real X server (tests/studio_xcb.sh)
  libboost-dev                 # Boost.DLL, header-only
  libprotobuf-dev protobuf-compiler
  libcli11-dev libfmt-dev
  libcpp-httplib-dev           # the metrics endpoint of headless runs (sluice run --metrics-addr)
  nlohmann-json3-dev           # dataset_info.json and features.json of tensorflow_datasets directories
  libarchive-dev               # WebDataset tar shards (plain, gzip, zstd)
  libroaring-dev               # the delivery ledger's record sets (compressed bitmaps)
  libssl-dev                   # SHA-256 and HMAC for signing object-store requests (core/modules/remote/)
  libcurl4-openssl-dev         # HTTP(S) to object stores and web servers (core/modules/remote/)
  libtinyxml2-dev              # S3's XML answers: errors and multipart uploads (core/modules/remote/)
  libexpat1-dev                # S3's listings, parsed as they arrive (core/modules/remote/)
  libgrpc++-dev protobuf-compiler-grpc  # the Sluice service: dispatcher, workers and trainers (core/service/)
  libzstd-dev libsnappy-dev    # the service's compression of elements on the wire; ArrayRecord's chunks
  libbrotli-dev libhighwayhash-dev  # ArrayRecord's brotli chunks and Riegeli's hashes (plugins/io/array_record.cpp)
  nginx-light python3-boto3    # the remote-storage tests: an HTTP(S) server and an independent S3 client
  python3-venv                 # the peers environment below
  openssl                      # the certificates of the TLS tests (remote storage, the service)
  clang-14 libclang-rt-14-dev   # libFuzzer targets (scripts/fuzz.sh)
  zlib1g-dev                   # gzip and zlib TFRecords
  libturbojpeg0-dev            # JPEG decoding (scaled in the DCT) and encoding
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev  # resizing, other formats
  python3-dev pybind11-dev libdlpack-dev  # the Python face (app/python): `import sluice`
  python3-numpy python3-pytest python3-torch  # its test suite (NumPy views, DLPack into PyTorch)
  openmpi-bin                  # mpirun: the many-workers tests (tests/cluster/)
  munge slurmctld slurmd slurm-client  # a one-node Slurm cluster for the same tests
  universal-ctags              # the house rules' function lengths (scripts/house.py, ctest house_rules)
)
if [ "${SLUICE_BENCH_DEPS:-0}" = 1 ]; then
  packages+=(gstreamer1.0-tools)  # gst-launch-1.0 and its core elements: the baseline of bench/
  packages+=(xdotool)  # bench/startup.sh: when the studio's window shows
  packages+=(python3-torchvision python3-pil)  # PyTorch's DataLoader baseline of bench/
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "Installing Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The peers environment: the real systems the tests take as oracles (tf.data, TFDS, webdataset,
# moto's S3 server, grain, pyarrow), pinned with hashes by tests/conformance/peers-requirements.txt,
# in a virtual environment of Debian's Python inside the build folder: nothing of it is needed to
# build or run Sluice, and the system Python is left as Debian made it. Made again only when the
# requirements file changed.
if [ "${SLUICE_PEERS:-1}" != 0 ]; then
  requirements=tests/conformance/peers-requirements.txt
  peers=${BUILD_DIR:-build}/peers
  if ! cat "$requirements" tests/conformance/uv-requirements.txt | cmp -s - "$peers/installed-from.txt" 2>/dev/null; then
    echo "Installing the peers environment into $peers (uv, from $requirements)"
    rm -rf "$peers"
    failed() { echo "Installing the peers environment failed (above); run scripts/install-deps.sh again" >&2; rm -rf "$peers"; exit 1; }
    /usr/bin/python3 -m venv "$peers" || failed
    # uv (pinned with its hashes too) installs them: 40 s where pip took 76-85 s. --no-deps: the
    # file lists every package the pins need; the bytecode is compiled now, not at each import
    # (the oracles run with PYTHONDONTWRITEBYTECODE: TensorFlow's import took 11 s without it, 4 s).
    "$peers/bin/pip" install -q --disable-pip-version-check --no-cache-dir --require-hashes --no-deps \
      -r tests/conformance/uv-requirements.txt || failed
    "$peers/bin/uv" pip install -q --no-cache --compile-bytecode --python "$peers/bin/python" --require-hashes --no-deps \
      -r "$requirements" || failed
    cat "$requirements" tests/conformance/uv-requirements.txt > "$peers/installed-from.txt"
  fi
  # bench/peers' own additions (SLUICE_BENCH_DEPS=1), into the same environment.
  if [ "${SLUICE_BENCH_DEPS:-0}" = 1 ] && ! cmp -s bench/peers/requirements.txt "$peers/bench-installed-from.txt" 2>/dev/null; then
    echo "Adding bench/peers/requirements.txt to the peers environment"
    "$peers/bin/uv" pip install -q --no-cache --compile-bytecode --python "$peers/bin/python" --require-hashes --no-deps \
      -r bench/peers/requirements.txt || { echo "Installing bench/peers/requirements.txt failed (above)" >&2; exit 1; }
    cp bench/peers/requirements.txt "$peers/bench-installed-from.txt"
  fi
fi
