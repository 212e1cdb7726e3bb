#!/usr/bin/env bash
# Installs the ONNX Runtime shared library (libonnxruntime.so) used by the
# embedded inference package (processors/inference/onnx) into a cache dir.
#
# The library is taken from the official `onnxruntime` wheel on PyPI: the wheel
# ships the same C-API shared library that the release tarballs contain, and
# PyPI is reachable everywhere this project builds. Nothing is installed into
# any Python environment; the wheel is only downloaded and unzipped.
#
# ONNXRUNTIME_VERSION must match the C API headers vendored by the Go binding
# github.com/yalue/onnxruntime_go (v1.27.0 -> onnxruntime 1.24.1, ORT_API_VERSION 24).
#
# Idempotent: if the library is already in the cache dir it does nothing.
# Prints the absolute path of the library on stdout (everything else on stderr).
#
# Env:
#   ONNXRUNTIME_VERSION  onnxruntime release (default 1.24.1)
#   ONNXRUNTIME_DIR      install dir (default $HOME/.cache/carehub/onnxruntime/<version>)
#   PYTHON               python interpreter with pip (default python3)
set -euo pipefail

ONNXRUNTIME_VERSION="${ONNXRUNTIME_VERSION:-1.24.1}"
ONNXRUNTIME_DIR="${ONNXRUNTIME_DIR:-${HOME}/.cache/carehub/onnxruntime/${ONNXRUNTIME_VERSION}}"
PYTHON="${PYTHON:-python3}"
LIB="${ONNXRUNTIME_DIR}/libonnxruntime.so"

log() { echo "onnxruntime-fetch: $*" >&2; }

if [[ -f "${LIB}" ]]; then
  echo "${LIB}"
  exit 0
fi

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64)  PLATFORM=manylinux_2_27_x86_64 ;;
  Linux/aarch64) PLATFORM=manylinux_2_27_aarch64 ;;
  *) log "unsupported platform $(uname -s)/$(uname -m) (only Linux x86_64/aarch64)"; exit 1 ;;
esac

command -v "${PYTHON}" >/dev/null || { log "${PYTHON} not found (needed for pip download)"; exit 1; }
command -v unzip >/dev/null || UNZIP_WITH_PYTHON=1

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

log "downloading onnxruntime==${ONNXRUNTIME_VERSION} wheel (${PLATFORM}) from PyPI"
# The shared library inside is the same for every CPython tag, so the wheel's
# Python tag is pinned (3.11) rather than taken from the local interpreter.
"${PYTHON}" -m pip download --quiet --disable-pip-version-check --no-deps \
  --only-binary=:all: --platform "${PLATFORM}" \
  --python-version 3.11 --implementation cp --abi cp311 \
  --dest "${tmp}" "onnxruntime==${ONNXRUNTIME_VERSION}" >&2

whl="$(ls "${tmp}"/onnxruntime-"${ONNXRUNTIME_VERSION}"-*.whl 2>/dev/null | head -n1)"
[[ -n "${whl}" ]] || { log "no onnxruntime ${ONNXRUNTIME_VERSION} wheel was downloaded"; exit 1; }

mkdir -p "${tmp}/x"
if [[ -n "${UNZIP_WITH_PYTHON:-}" ]]; then
  "${PYTHON}" - "${whl}" "${tmp}/x" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.startswith("onnxruntime/capi/libonnxruntime.so"):
        z.extract(n, sys.argv[2])
PY
else
  unzip -q -o "${whl}" 'onnxruntime/capi/libonnxruntime.so*' -d "${tmp}/x"
fi

src="$(ls "${tmp}"/x/onnxruntime/capi/libonnxruntime.so* 2>/dev/null | sort | tail -n1)"
[[ -n "${src}" ]] || { log "wheel ${whl##*/} has no onnxruntime/capi/libonnxruntime.so*"; exit 1; }

# The library's SHA-256 is pinned per version and platform (as PyPI served it on 2026-12-02): a
# wheel whose library differs is refused. ONNXRUNTIME_SHA256 overrides the pin (a new version).
declare -A PINNED=(
  ["1.24.1/manylinux_2_27_x86_64"]=94ac52f650e195b784587e1cb7d25b4bf074048b50fa9a7127795b2ed34db22e
)
want="${ONNXRUNTIME_SHA256:-${PINNED["${ONNXRUNTIME_VERSION}/${PLATFORM}"]:-}}"
if [[ -n "${want}" ]]; then
  got="$(sha256sum "${src}" | cut -d' ' -f1)"
  [[ "${got}" == "${want}" ]] || { log "${src##*/} has SHA-256 ${got}, want ${want}: refused"; exit 1; }
else
  log "no pinned SHA-256 for onnxruntime ${ONNXRUNTIME_VERSION} on ${PLATFORM}: the library is not verified (set ONNXRUNTIME_SHA256)"
fi

# Install atomically: copy into a staging dir next to the target, then rename,
# so a concurrent or interrupted run never leaves a half-written library.
mkdir -p "$(dirname "${ONNXRUNTIME_DIR}")"
stage="$(mktemp -d "${ONNXRUNTIME_DIR}.tmp.XXXXXX")"
chmod 755 "${stage}"
cp "${src}" "${stage}/$(basename "${src}")"
if [[ "$(basename "${src}")" != libonnxruntime.so ]]; then
  ln -s "$(basename "${src}")" "${stage}/libonnxruntime.so"
fi
echo "${ONNXRUNTIME_VERSION} ${whl##*/}" > "${stage}/VERSION"
if [[ -d "${ONNXRUNTIME_DIR}" ]]; then
  # exists but without the library (e.g. emptied): fill it in place
  cp -a "${stage}/." "${ONNXRUNTIME_DIR}/"
  rm -rf "${stage}"
else
  mv "${stage}" "${ONNXRUNTIME_DIR}" 2>/dev/null || rm -rf "${stage}"  # lost a race: fine
fi

[[ -f "${LIB}" ]] || { log "install failed: ${LIB} missing"; exit 1; }
log "installed $(basename "${src}") into ${ONNXRUNTIME_DIR}"
echo "${LIB}"
