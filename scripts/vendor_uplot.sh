#!/usr/bin/env bash
# Rebuild tbmem/_internal/plugin/static/vendor/uplot/ from the npm registry: uPlot's own built files
# (dist/uPlot.iife.min.js, dist/uPlot.min.css) and its MIT licence, unchanged.
#
#   scripts/vendor_uplot.sh            # the pinned version below
#   scripts/vendor_uplot.sh 1.6.33     # another version (then update the pin and re-run the tests)
#
# `npm pack` checks the tarball against the registry's integrity hash; the script then records the
# version and the sha256 of every vendored file in VERSION, which tests/plugin/test_vendor.py checks.
set -euo pipefail

VERSION="${1:-1.6.32}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/tbmem/plugin/static/vendor/uplot"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

cd "$WORK"
npm pack --silent "uplot@${VERSION}" >/dev/null
tar xzf "uplot-${VERSION}.tgz"
grep -q "(v${VERSION})" package/dist/uPlot.iife.min.js || {
  echo "uPlot ${VERSION}: dist/uPlot.iife.min.js does not carry its version header" >&2; exit 1; }

mkdir -p "$DEST"
cp package/dist/uPlot.iife.min.js package/dist/uPlot.min.css package/LICENSE "$DEST/"
{
  echo "uplot ${VERSION} (https://www.npmjs.com/package/uplot, MIT), built files copied unchanged"
  echo "integrity $(npm view "uplot@${VERSION}" dist.integrity 2>/dev/null)"
  (cd "$DEST" && sha256sum LICENSE uPlot.iife.min.js uPlot.min.css)
} > "$DEST/VERSION"
echo "vendored uPlot ${VERSION} into ${DEST#"$ROOT"/}"
