package extract

import (
	"archive/zip"
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name string
		head string
		want Format
	}{
		{"a.pdf", "", PDF},
		{"A.PDF", "", PDF},
		{"x.bin", "%PDF-1.7\n", PDF},
		{"page.htm", "", HTML},
		{"page", "  <!DOCTYPE html><html>", HTML},
		{"page", "<HTML><body>", HTML},
		{"report.docx", "PK\x03\x04", DOCX},
		{"notes.txt", "<html>", HTML},
		{"notes.txt", "plain", ""},
		{"archive.zip", "PK\x03\x04", ""},
	} {
		assert.Equal(t, tc.want, Detect(tc.name, []byte(tc.head)), "%s %q", tc.name, tc.head)
	}
}

func TestHTMLVisibleText(t *testing.T) {
	page := `<!DOCTYPE html><html><head><title>Trip  notes</title>
<style>body { color: red }</style><script>var secret = "function";</script></head>
<body><nav><a href="/">Home</a> <a href="/about">About</a></nav>
<header><h1>Our trip</h1></header>
<div role="navigation">Skip to content</div>
<article><p>We took the <b>night</b> train to Oslo.</p>
<p style="display: none">hidden tracking text</p>
<table><tr><th>Day</th><th>Town</th></tr><tr><td>1</td><td>Bergen</td></tr></table>
<pre>line one
  line two</pre>
<form><input name="q"><button>Search</button></form>
<noscript>enable JS</noscript></article>
<footer>© 2026 us</footer></body></html>`
	doc, err := File(HTML, []byte(page), Limits{})
	require.NoError(t, err)
	assert.Equal(t, "Trip notes", doc.Title)
	assert.Equal(t, "Trip notes", doc.Meta["title"])
	assert.Equal(t, "Our trip\nWe took the night train to Oslo.\nDay | Town\n1 | Bergen\nline one\n  line two\n© 2026 us", doc.Text)
	for _, gone := range []string{"color", "secret", "Home", "Skip", "hidden", "Search", "enable JS"} {
		assert.NotContains(t, doc.Text, gone)
	}

	doc, err = File(HTML, []byte(`<html><body><h2>Only a heading</h2>text</body></html>`), Limits{})
	require.NoError(t, err)
	assert.Equal(t, "Only a heading", doc.Title, "no <title>: the first heading")

	// A page in another charset, said in its meta tag.
	latin := append([]byte(`<html><head><meta charset="iso-8859-1"></head><body>caf`), 0xe9, '<', '/', 'b', 'o', 'd', 'y', '>')
	doc, err = File(HTML, latin, Limits{})
	require.NoError(t, err)
	assert.Equal(t, "café", doc.Text)

	_, err = File(HTML, []byte(`<html><script>only code</script></html>`), Limits{})
	assert.ErrorIs(t, err, ErrNoText)
}

// docxFile writes a zip of the given entries.
func docxFile(t *testing.T, entries map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for name, body := range entries {
		w, err := zw.Create(name)
		require.NoError(t, err)
		_, err = w.Write([]byte(body))
		require.NoError(t, err)
	}
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

const wordNS = `xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"`

func TestDOCXParagraphsAndTables(t *testing.T) {
	body := `<w:document ` + wordNS + `><w:body>
<w:p><w:r><w:t>Budget</w:t></w:r><w:r><w:t xml:space="preserve"> for 2027</w:t></w:r></w:p>
<w:tbl><w:tr><w:tc><w:p><w:r><w:t>Item</w:t></w:r></w:p></w:tc><w:tc><w:p><w:r><w:t>Cost</w:t></w:r></w:p></w:tc></w:tr>
<w:tr><w:tc><w:p><w:r><w:t>Roof</w:t></w:r></w:p><w:p><w:r><w:t>and gutters</w:t></w:r></w:p></w:tc><w:tc><w:p><w:r><w:t>4,200</w:t></w:r></w:p></w:tc></w:tr></w:tbl>
<w:p><w:r><w:t>Total</w:t></w:r><w:r><w:tab/><w:t>4,200</w:t></w:r></w:p>
</w:body></w:document>`
	core := `<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/core-properties" xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>House budget</dc:title><dc:creator>Ann</dc:creator></cp:coreProperties>`
	doc, err := File(DOCX, docxFile(t, map[string]string{"word/document.xml": body, "docProps/core.xml": core}), Limits{})
	require.NoError(t, err)
	assert.Equal(t, "Budget for 2027\nItem | Cost\nRoof and gutters | 4,200\nTotal\t4,200", doc.Text)
	assert.Equal(t, "House budget", doc.Title)
	assert.Equal(t, "Ann", doc.Meta["author"])
}

func TestDOCXRefusals(t *testing.T) {
	// A zip bomb: a megabyte of zeros compresses a thousandfold.
	bomb := docxFile(t, map[string]string{"word/document.xml": `<w:document ` + wordNS + `><w:body><w:p><w:r><w:t>` + strings.Repeat("0", 1<<20) + `</w:t></w:r></w:p></w:body></w:document>`})
	_, err := File(DOCX, bomb, Limits{})
	require.ErrorIs(t, err, ErrTooLarge)
	assert.Contains(t, err.Error(), "word/document.xml")
	// Under a byte budget it fails as soon as the budget is read.
	_, err = File(DOCX, bomb, Limits{Expanded: 1 << 10, Ratio: 1 << 30})
	require.ErrorIs(t, err, ErrTooLarge)
	assert.Contains(t, err.Error(), "expands past 1024 bytes")

	_, err = File(DOCX, []byte("PK\x03\x04 this is not really a zip"), Limits{})
	assert.ErrorIs(t, err, ErrCorrupt)
	good := docxFile(t, map[string]string{"word/document.xml": `<w:document ` + wordNS + `><w:body><w:p><w:r><w:t>hello</w:t></w:r></w:p></w:body></w:document>`})
	_, err = File(DOCX, good[:len(good)/2], Limits{})
	assert.ErrorIs(t, err, ErrCorrupt, "truncated")
	_, err = File(DOCX, docxFile(t, map[string]string{"other.xml": "<a/>"}), Limits{})
	assert.ErrorContains(t, err, "without word/document.xml")
	_, err = File(DOCX, docxFile(t, map[string]string{"word/document.xml": "<w:document><w:body><w:p>"}), Limits{})
	assert.ErrorIs(t, err, ErrCorrupt, "XML cut short")
}

func TestPageAt(t *testing.T) {
	pages := []int{0, 4, 8}
	for off, want := range map[int]int{0: 1, 3: 1, 4: 2, 7: 2, 8: 3, 10: 3} {
		assert.Equal(t, want, PageAt(pages, off), "offset %d", off)
	}
	assert.Zero(t, PageAt(nil, 0))
}

func FuzzHTML(f *testing.F) {
	f.Add([]byte(`<html><head><title>t</title></head><body><p>a<b>b</b></p><table><tr><td>1</td></tr></table></body></html>`))
	f.Add([]byte(`<pre>x</pre><script>`))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := File(HTML, data, Limits{})
		if err == nil {
			assert.NotEmpty(t, strings.TrimSpace(doc.Text))
		}
	})
}

func FuzzDOCX(f *testing.F) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	w, _ := zw.Create("word/document.xml")
	w.Write([]byte(`<w:document ` + wordNS + `><w:body><w:p><w:r><w:t>hi</w:t></w:r></w:p><w:tbl><w:tr><w:tc><w:p><w:r><w:t>c</w:t></w:r></w:p></w:tc></w:tr></w:tbl></w:body></w:document>`))
	zw.Close()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := File(DOCX, data, Limits{Expanded: 1 << 20})
		if err == nil {
			assert.NotEmpty(t, strings.TrimSpace(doc.Text))
		}
	})
}

// minimalPDF is a one-page PDF written by hand, a fuzzing seed (the
// quality of PDF reading is measured on real files: docs/BENCHMARKS.md).
const minimalPDF = "%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n" +
	"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n" +
	"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 300 100]/Contents 4 0 R/Resources<</Font<</F1 5 0 R>>>>>>endobj\n" +
	"4 0 obj<</Length 44>>stream\nBT /F1 12 Tf 10 50 Td (Hello pdfium) Tj ET\nendstream endobj\n" +
	"5 0 obj<</Type/Font/Subtype/Type1/BaseFont/Helvetica>>endobj\n" +
	"trailer<</Root 1 0 R>>\n%%EOF\n"

func TestPDFHandWritten(t *testing.T) {
	doc, err := File(PDF, []byte(minimalPDF), Limits{})
	require.NoError(t, err)
	assert.Equal(t, "Hello pdfium", doc.Text)
	assert.Equal(t, []int{0}, doc.Pages)
	_, err = File(PDF, []byte(minimalPDF[:len(minimalPDF)/3]), Limits{})
	assert.ErrorIs(t, err, ErrCorrupt, "cut short")
	_, err = File(PDF, []byte("%PDF-1.7 and then nothing of a PDF"), Limits{})
	assert.ErrorIs(t, err, ErrCorrupt)
}

// TestPDFMutations feeds pdfium thousands of damaged PDFs: bytes flipped,
// cut, repeated. Each must come back as text or an error, never a crash
// or a hang. (Go's fuzzing engine cannot drive it: under its coverage
// instrumentation, compiling pdfium's WebAssembly takes longer than the
// engine waits for a worker to start.)
func TestPDFMutations(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	seed := []byte(minimalPDF)
	n := 2000
	if testing.Short() {
		n = 200
	}
	ok := 0
	for i := range n {
		b := slices.Clone(seed)
		for range 1 + rng.IntN(8) {
			switch rng.IntN(4) {
			case 0: // flip a byte
				b[rng.IntN(len(b))] = byte(rng.IntN(256))
			case 1: // cut
				b = b[:rng.IntN(len(b))+1]
			case 2: // repeat a span
				at, l := rng.IntN(len(b)), rng.IntN(64)
				b = slices.Insert(b, at, b[at:min(len(b), at+l)]...)
			case 3: // drop a span
				at := rng.IntN(len(b))
				b = slices.Delete(b, at, min(len(b), at+rng.IntN(32)))
			}
			if len(b) == 0 {
				b = []byte{'%'}
			}
		}
		doc, err := File(PDF, b, Limits{})
		if err == nil {
			ok++
			require.NotEmpty(t, strings.TrimSpace(doc.Text), "mutation %d", i)
			continue
		}
		require.True(t, errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNoText) || errors.Is(err, ErrEncrypted), "mutation %d: %v", i, err)
	}
	t.Logf("%d of %d damaged PDFs still gave text", ok, n)
}
