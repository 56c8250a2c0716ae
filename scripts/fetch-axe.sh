#!/usr/bin/env bash
# Fetches axe-core (Deque's accessibility rules engine) from npm into DIR
# (default build/axe-core): DIR/axe.min.js is what the browser test runs in
# the device's page. The tarball is checked against the SHA-256 below; an
# install whose .complete marker holds it is left alone. Needs npm.
set -euo pipefail
dir=${1:-build/axe-core}
PKG=axe-core@4.14.1
SHA=e6b0ce02b84d892e2e33e403485e7f3d6c29e2be6df65daf44d89ba564139745

if [ -f "$dir/.complete" ] && [ "$(cat "$dir/.complete")" = "$SHA" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "error: npm is required (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching $PKG from npm..." >&2
tgz=$(cd "$tmp" && npm pack --silent "$PKG" 2>/dev/null | tail -n 1)
if [ -z "$tgz" ] || [ ! -f "$tmp/$tgz" ]; then
  echo "error: npm pack $PKG failed (is the npm registry reachable?)" >&2
  exit 1
fi
if ! echo "$SHA  $tmp/$tgz" | sha256sum -c --status; then
  echo "error: $PKG tarball does not match SHA-256 $SHA" >&2
  exit 1
fi
tar -xzf "$tmp/$tgz" -C "$tmp"
mkdir -p "$dir"
cp "$tmp/package/axe.min.js" "$tmp/package/LICENSE" "$dir/"
echo "$SHA" >"$dir/.complete"
echo "axe-core ready: $dir/axe.min.js" >&2
