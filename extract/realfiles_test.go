package extract

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/textscore"
	"github.com/dragon-rag/dragon/internal/testmodel"
)

func median(x []float64) float64 {
	slices.Sort(x)
	return x[len(x)/2]
}

// TestRealFiles measures extraction on real files against established
// tools (make formats: pdftotext for PDFs, w3m for HTML, python-docx for
// DOCX) and holds it to what was measured when the readers were chosen
// (docs/BENCHMARKS.md, "Extraction"): a regression in a reader, or a
// reader swapped for a worse one, fails here.
func TestRealFiles(t *testing.T) {
	dir := testmodel.FormatsDir(t)
	type score struct{ p, r, f []float64 }
	scores := map[Format]*score{PDF: {}, HTML: {}, DOCX: {}}
	for _, sub := range []string{"pdf", "html", "docx"} {
		files, err := filepath.Glob(filepath.Join(dir, sub, "*"))
		require.NoError(t, err)
		require.NotEmpty(t, files, "make formats fetched no %s files", sub)
		for _, path := range files {
			name := filepath.Base(path)
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			format := Detect(name, data)
			require.NotEmpty(t, format, name)
			doc, err := File(format, data, Limits{})
			ref, rerr := os.ReadFile(filepath.Join(dir, "ref", name+".txt"))
			switch {
			case strings.HasPrefix(name, "encrypted-userpw"):
				assert.ErrorIs(t, err, ErrEncrypted, name)
				continue
			case strings.HasPrefix(name, "scan-imageonly"):
				assert.ErrorIs(t, err, ErrNoText, name)
				assert.ErrorContains(t, err, "OCR", name)
				continue
			case rerr != nil || len(textscore.Words(string(ref))) == 0:
				// No reference text (the reference tool failed, or the file
				// holds none): only that it is read or refused cleanly.
				if err != nil {
					assert.True(t, errors.Is(err, ErrNoText) || errors.Is(err, ErrCorrupt), "%s: %v", name, err)
				}
				continue
			}
			require.NoError(t, err, name)
			p, r, f := textscore.F1(doc.Text, string(ref))
			t.Logf("%-5s %-48s P=%.3f R=%.3f F1=%.3f pages=%d title=%q", format, name, p, r, f, len(doc.Pages), doc.Title)
			s := scores[format]
			s.p, s.r, s.f = append(s.p, p), append(s.r, r), append(s.f, f)
			if format == PDF {
				assert.GreaterOrEqual(t, f, 0.9, "%s: word F1 against pdftotext", name)
				assert.NotEmpty(t, doc.Pages, name)
			}
		}
	}
	for format, s := range scores {
		require.NotEmpty(t, s.f, "%s: no file with a reference", format)
		t.Logf("%s: %d files, median P=%.3f R=%.3f F1=%.3f", format, len(s.f), median(s.p), median(s.r), median(s.f))
	}
	assert.GreaterOrEqual(t, median(scores[PDF].f), 0.98, "PDF")
	assert.GreaterOrEqual(t, median(scores[DOCX].f), 0.98, "DOCX")
	// HTML: all the text a browser shows but the page's chrome, which is
	// dropped on purpose: precision near 1, recall a little lower.
	assert.GreaterOrEqual(t, median(scores[HTML].p), 0.99, "HTML precision")
	assert.GreaterOrEqual(t, median(scores[HTML].r), 0.9, "HTML recall")

	data, err := os.ReadFile(filepath.Join(dir, "damaged", "truncated.pdf"))
	require.NoError(t, err)
	_, err = File(PDF, data, Limits{})
	assert.ErrorIs(t, err, ErrCorrupt, "a real PDF cut in half")
}
