#!/usr/bin/env bash
# Real PDF, HTML and DOCX files for the extraction tests and the document
# API's end-to-end test, with reference texts from established tools:
# poppler's pdftotext for PDFs, w3m's rendering for HTML, python-docx for
# DOCX. The files come from Debian packages (apt-get download) and PyPI
# sdists (pinned), never from our own code; see data/formats/SOURCES.
#
#   scripts/fetch-formats.sh DIR     (make formats: DIR = data/formats)
set -euo pipefail
out=${1:?usage: fetch-formats.sh DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out"/{pdf,html,docx,ref,damaged}
mkdir -p "$out"/{pdf,html,docx,ref,damaged}
: > "$out/SOURCES"

echo "fetching real PDF, HTML and DOCX files (Debian packages, PyPI sdists; about 25 MB)..."
cd "$tmp"
debs="gnuplot-doc r-cran-sandwich python-reportlab-doc asymptote-doc debian-faq python-attr-doc"
for p in $debs; do
  apt-get download "$p" >/dev/null 2>&1 || { echo "apt-get download $p failed" >&2; exit 1; }
done
for d in *.deb; do dpkg-deb -x "$d" deb; echo "Debian ${d%.deb}" >> "$out/SOURCES"; done
python3 -m pip download --quiet --disable-pip-version-check --no-binary :all: --no-deps -d . \
  pypdf==7.1.1 ocrmypdf==17.13.0 python-docx==1.1.2
for s in pypdf-7.1.1 ocrmypdf-17.13.0 python_docx-1.1.2; do tar xzf "$s.tar.gz"; echo "PyPI $s (sdist)" >> "$out/SOURCES"; done

# name <- path
pdf() { cp "$2" "$out/pdf/$1.pdf"; echo "  pdf/$1.pdf <- ${2#./}" >> "$out/SOURCES"; }
pdf gnuplot-manual deb/usr/share/doc/gnuplot/gnuplot.pdf
pdf r-sandwich-CL deb/usr/lib/R/site-library/sandwich/doc/sandwich-CL.pdf
pdf reportlab-userguide deb/usr/share/doc/python-reportlab-doc/reportlab-userguide.pdf
pdf asy-refcard deb/usr/share/doc/asymptote/asyRefCard.pdf
r=pypdf-7.1.1/resources
pdf word2010-geobase $r/GeoBase_NHNC1_Data_Model_UML_EN.pdf
pdf libreoffice-multilang $r/multilang.pdf
pdf googledocs-example $r/example.pdf
pdf excel-cjk $r/issue-914-xmp-data.pdf
pdf autocad-diagram $r/AutoCad_Diagram.pdf
pdf cairo-selenium $r/selenium-pypdf-issue-177.pdf
pdf broken-xref-leadtools $r/issue-301.pdf
pdf scan-ocr-vicksburg $r/Seige_of_Vicksburg_Sample_OCR.pdf
pdf encrypted-aes256-emptypw $r/encryption/r6-empty-password.pdf
pdf encrypted-userpw $r/encrypted-file.pdf
r=ocrmypdf-17.13.0/tests/resources
pdf word-quartz-link $r/link.pdf
pdf libreoffice-tagged $r/tagged.pdf
pdf scan-imageonly-cardinal $r/cardinal.pdf
# A real PDF cut in half: what an interrupted upload leaves.
head -c $(( $(stat -c %s "$out/pdf/reportlab-userguide.pdf") / 2 )) "$out/pdf/reportlab-userguide.pdf" > "$out/damaged/truncated.pdf"

for f in deb/usr/share/doc/debian/FAQ/*.html deb/usr/share/doc/python-attr-doc/html/*.html; do
  n=$(basename "$(dirname "$(dirname "$f")")")-$(basename "$f")
  case $n in *-search.html|*-genindex.html|*-py-modindex.html) continue;; esac # script-driven pages
  cp "$f" "$out/html/$n"
done
echo "  html/ <- debian-faq's and python-attr-doc's pages" >> "$out/SOURCES"
cp python_docx-1.1.2/features/steps/test_files/*.docx "$out/docx/"
echo "  docx/ <- python-docx's test documents (written by Word)" >> "$out/SOURCES"

echo "reference texts (pdftotext, w3m, python-docx)..."
for f in "$out"/pdf/*.pdf; do
  pdftotext -q -enc UTF-8 "$f" "$out/ref/$(basename "$f").txt" || : > "$out/ref/$(basename "$f").txt"
done
for f in "$out"/html/*.html; do
  w3m -dump -T text/html -cols 10000 "$f" > "$out/ref/$(basename "$f").txt"
done
python3 -m pip install --quiet --disable-pip-version-check --target "$tmp/py" python-docx==1.1.2 >/dev/null
PYTHONPATH="$tmp/py" python3 - "$out" <<'EOF'
import os, sys
import docx
from docx.table import Table
from docx.text.paragraph import Paragraph
out = sys.argv[1]
for name in sorted(os.listdir(os.path.join(out, "docx"))):
    try:
        d = docx.Document(os.path.join(out, "docx", name))
    except Exception:
        continue  # python-docx cannot read it: no reference
    lines = []
    for child in d.element.body.iterchildren():
        if not isinstance(child.tag, str):
            continue  # comments, processing instructions
        tag = child.tag.split('}')[1]
        if tag == 'p':
            lines.append(Paragraph(child, d).text)
        elif tag == 'tbl':
            for row in Table(child, d).rows:
                seen = []
                for c in row.cells:
                    if c._tc not in seen:
                        seen.append(c._tc)
                        lines.append(c.text)
    with open(os.path.join(out, "ref", name + ".txt"), "w") as f:
        f.write("\n".join(lines))
EOF
# Not "| head -1": pdftotext would die of SIGPIPE writing its other
# lines, and pipefail fails the script on that (seen in CI).
v=$(pdftotext -v 2>&1 || true)
echo "${v%%$'\n'*}" >> "$out/SOURCES"
echo "formats in $out: $(ls "$out"/pdf | wc -l) PDFs, $(ls "$out"/html | wc -l) HTML pages, $(ls "$out"/docx | wc -l) DOCX files"
