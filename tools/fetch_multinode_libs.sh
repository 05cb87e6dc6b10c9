#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The system libraries of the `multinode` extra (mooncake-transfer-engine-non-cuda links libibverbs.so.1, which
# needs libnl-3 and libnl-route-3) without root: `apt-get download` the Debian packages libibverbs1, libnl-3-200
# and libnl-route-3-200 into a cache and unpack them (`dpkg-deb -x`) into DEST. The plugin loads them from there
# (vllm_omni_token2wav/patch/mooncake_libs.py: DEST defaults to <venv>/lib/token2wav-system-libs, or set
# VLLM_OMNI_TOKEN2WAV_SYSTEM_LIBS); other programs can use the printed LD_LIBRARY_PATH.
# With root, `apt-get install libibverbs1 libnl-3-200 libnl-route-3-200` does the same system-wide.
# Usage: bash tools/fetch_multinode_libs.sh DEST [CACHE]   (CACHE defaults to DEST/debs)
set -euo pipefail
DEST="${1:?usage: fetch_multinode_libs.sh DEST [CACHE]}"
CACHE="${2:-$DEST/debs}"
PACKAGES=(libibverbs1 libnl-3-200 libnl-route-3-200)
mkdir -p "$DEST" "$CACHE"
DEST="$(cd "$DEST" && pwd)"
have=1
for p in "${PACKAGES[@]}"; do ls "$CACHE/${p}_"*.deb >/dev/null 2>&1 || have=0; done
if [ "$have" = 0 ]; then
  # apt-get download needs no root; it reads the host's package lists. Where they are empty or stale (a fresh CI
  # host), refresh a private copy of them under CACHE (no root, the host's lists untouched) and download again.
  if ! (cd "$CACHE" && apt-get download "${PACKAGES[@]}"); then
    lists=(-o "Dir::State::Lists=$CACHE/lists" -o "Dir::Cache=$CACHE/apt-cache" -o Debug::NoLocking=1)
    mkdir -p "$CACHE/lists/partial" "$CACHE/apt-cache/archives/partial"
    apt-get "${lists[@]}" update -qq
    (cd "$CACHE" && apt-get "${lists[@]}" download "${PACKAGES[@]}")
  fi
fi
for p in "${PACKAGES[@]}"; do dpkg-deb -x "$(ls "$CACHE/${p}_"*.deb | tail -1)" "$DEST"; done
dirs="$(find "$DEST" -name '*.so*' ! -path "$CACHE/*" -printf '%h\n' | sort -u | paste -sd:)"
echo "LD_LIBRARY_PATH=$dirs"
