#!/usr/bin/env bash
# Builds Weaviate's server (VERSION, the module the Go module proxy
# serves) into OUT/weaviate-server, with scripts/weaviate-blockmax.patch
# applied to its source:
#   scripts/build-weaviate.sh VERSION OUT
# The patch fixes BlockMax WAND's top k in 1.35.2: a memtable flushed to a
# segment recorded each block's best (tf, length) pair by an impact with
# BM25's k1 and b swapped (compaction passes them in order), so the bound
# read back could sit below a block's best score and the search skipped
# passages of the true top k (docs/DESIGN-NOTES.md, Retrieval). Upstream
# fixed the same call after 1.35.2, in a release the module proxy here
# does not serve.
set -euo pipefail
version=${1:?usage: build-weaviate.sh VERSION OUT}
out=${2:?usage: build-weaviate.sh VERSION OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
patch=$root/scripts/weaviate-blockmax.patch
mod=github.com/weaviate/weaviate

for tool in go patch sha256sum; do
  command -v "$tool" >/dev/null || { echo "error: $tool is needed to build Weaviate" >&2; exit 1; }
done
# Outside any module, so that no go.mod around decides what is fetched.
empty=$(mktemp -d)
trap 'rmdir "$empty"' EXIT
dir=$(cd "$empty" && go mod download -json "$mod@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { echo "error: go mod download gave no source for $mod@$version" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
src=$out/src
rm -rf "$src" "$src.part"
cp -R "$dir" "$src.part"
chmod -R u+w "$src.part"
# patch refuses a source whose lines differ from the patch's context.
patch -d "$src.part" -p1 --fuzz=0 --forward --batch --no-backup-if-mismatch --quiet <"$patch" ||
  { echo "error: $patch does not apply to $mod@$version" >&2; exit 1; }
mv "$src.part" "$src"
echo "building weaviate-server $version with $(basename "$patch") (a few minutes)..."
(cd "$src" && go build -trimpath -o "$out/weaviate-server.part" ./cmd/weaviate-server)
mv "$out/weaviate-server.part" "$out/weaviate-server"
# What the binary was built from, for make to rebuild when it changes.
{ echo "$mod@$version"; sha256sum <"$patch"; } >"$out/BUILD"
rm -rf "$src"
