package extract

import (
	"archive/zip"
	"bytes"
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
		{"a.pdf", "", ""},
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
