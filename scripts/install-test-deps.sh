#!/usr/bin/env bash
# Installs the peers Tessera's tests run against, from Debian's packages,
# when they are missing: ISA-L (parity bytes), and the tools later layers
# test with. Safe to run again; does nothing when all are present.
set -euo pipefail

# fonts-dejavu-core: labels on PNG charts. libnbd-bin (nbdinfo, nbdcopy,
# nbdfuse), python3-libnbd, nbdkit, qemu-utils (qemu-img, qemu-io) and fio: the NBD clients
# and the reference server the array is tested against; fuse2fs and
# e2fsprogs (mkfs.ext4, e2fsck, debugfs): ext4 through nbdfuse; openssl:
# the TLS tests' certificates; python3: socket activation as systemd does it;
# python3-pip: fetches NVRTC (below); curl and chromium-headless-shell: the
# HTTP API and the dashboard, tested as a browser renders it;
# qemu-user, gcc-aarch64-linux-gnu and libc6-dev-arm64-cross: the erasure
# code's NEON kernel, built for aarch64 and tested under qemu-aarch64;
# python3-venv: the Python environment with pyarrow (below); g++: the GPU
# kernels' hash functions built for the host and checked there.
packages=(libisal-dev libisal2 libssl-dev pkg-config zstd lz4 b3sum openssl gzip python3 curl chromium-headless-shell
  python3-pip fonts-dejavu-core libnbd-bin python3-libnbd nbdkit qemu-utils fio fuse2fs e2fsprogs
  qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross python3-venv g++)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "installing test dependencies: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# NVRTC, NVIDIA's run-time CUDA compiler, from its PyPI wheel (no GPU or
# CUDA toolkit needed): the tests compile the GPU backend's kernels with it.
# Unpacked into target/test-deps/nvrtc; scripts/test.sh puts its lib folder
# on LD_LIBRARY_PATH.
nvrtc=target/test-deps/nvrtc
if [ ! -e "$nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
  echo "fetching NVRTC (nvidia-cuda-nvrtc-cu12 wheel)" >&2
  rm -rf "$nvrtc"
  python3 -m pip download -q --no-deps --only-binary=:all: --dest "$nvrtc/wheel" \
    nvidia-cuda-nvrtc-cu12==12.9.86
  python3 -m zipfile -e "$nvrtc"/wheel/*.whl "$nvrtc"
  rm -rf "$nvrtc/wheel"
fi

# pyarrow (with numpy), the Arrow Flight client the KV spaces are tested
# with, in a Python environment of its own: target/test-deps/venv, from
# Debian's python3 (scripts/test.sh points the tests at it).
venv=target/test-deps/venv
if ! "$venv/bin/python" -c "import pyarrow.flight, numpy" 2>/dev/null; then
  echo "making $venv with pyarrow and numpy" >&2
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --only-binary=:all: pyarrow==26.0.1 numpy==2.4.6
fi

# The Rust standard library for aarch64, for the NEON kernel's tests.
if ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
  echo "adding the aarch64-unknown-linux-gnu Rust target" >&2
  rustup target add aarch64-unknown-linux-gnu
fi
