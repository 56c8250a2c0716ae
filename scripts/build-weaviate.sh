#!/usr/bin/env bash
# Builds Weaviate's server (VERSION, as the Go module proxy serves its
# source) into OUT/weaviate-server, and records VERSION in OUT/BUILD; does
# nothing when OUT already holds that version:
#   scripts/build-weaviate.sh VERSION OUT
# VERSION must be 1.38.3 or later with BlockMax WAND on (cluster.sh's
# default): earlier releases drop passages of the true BM25 top k
# (docs/DESIGN-NOTES.md, Retrieval).
set -euo pipefail
version=${1:?usage: build-weaviate.sh VERSION OUT}
out=${2:?usage: build-weaviate.sh VERSION OUT}
mod=github.com/weaviate/weaviate

mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -x "$out/weaviate-server" ] && [ "$(cat "$out/BUILD" 2>/dev/null)" = "$mod@$version" ]; then
  exit 0
fi
command -v go >/dev/null || { echo "error: go is needed to build Weaviate" >&2; exit 1; }
# Outside any module, so that no go.mod around decides what is fetched.
empty=$(mktemp -d)
trap 'rmdir "$empty"' EXIT
dir=$(cd "$empty" && go mod download -json "$mod@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { echo "error: go mod download gave no source for $mod@$version" >&2; exit 1; }
echo "building weaviate-server $version (a few minutes)..."
# Test packages may build at once: each into a file of its own, renamed
# into place.
part=$(mktemp "$out/weaviate-server.XXXXXX")
trap 'rmdir "$empty"; rm -f "$part"' EXIT
rm -f "$out/BUILD"
(cd "$dir" && go build -trimpath -o "$part" ./cmd/weaviate-server)
mv "$part" "$out/weaviate-server"
echo "$mod@$version" >"$out/BUILD"
