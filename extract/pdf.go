package extract

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/klippa-app/go-pdfium"
	"github.com/klippa-app/go-pdfium/requests"
	"github.com/klippa-app/go-pdfium/webassembly"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
)

// PDFs are read by pdfium, compiled to WebAssembly and run by wazero (go-
// pdfium's webassembly backend): pure Go, so the static arm64 build keeps
// it. Chosen by measurement against poppler's pdftotext on 23 real PDFs
// (docs/BENCHMARKS.md, "Extraction"): median word F1 0.995, lowest 0.943,
// none failed; the pure-Go parsers scored 0.35-0.96 and failed on 1-10.
// Starting it compiles a 5.8 MB module: 3-4 s and a peak of about 315 MB
// the first time, 0.1 s and 51 MB once the compiled code is in a cache on
// disk (PDFCacheDir). So it starts with the first PDF, once, and one
// instance serves the process: pdfium is not safe for concurrent use.
var pdfEngine struct {
	once sync.Once
	mu   sync.Mutex
	inst pdfium.Pdfium
	err  error
}

// PDFCacheDir is where the PDF reader keeps its compiled code between
// runs; empty: the user's cache folder (os.UserCacheDir), or none when
// there is none. Set it before the first PDF.
var PDFCacheDir string

func pdfRuntime() wazero.RuntimeConfig {
	// The pdfium module lowers setjmp/longjmp to WebAssembly exceptions.
	rc := wazero.NewRuntimeConfig().WithCoreFeatures(api.CoreFeaturesV2 | experimental.CoreFeaturesExceptionHandling)
	dir := PDFCacheDir
	if dir == "" {
		if base, err := os.UserCacheDir(); err == nil {
			dir = filepath.Join(base, "dragon", "pdfium")
		}
	}
	if dir != "" {
		if cache, err := wazero.NewCompilationCacheWithDir(dir); err == nil {
			rc = rc.WithCompilationCache(cache)
		}
	}
	return rc
}

func pdfInstance() (pdfium.Pdfium, error) {
	pdfEngine.once.Do(func() {
		pool, err := webassembly.Init(webassembly.Config{MinIdle: 1, MaxIdle: 1, MaxTotal: 1, RuntimeConfig: pdfRuntime()})
		if err != nil {
			pdfEngine.err = fmt.Errorf("start the PDF reader: %w", err)
			return
		}
		if pdfEngine.inst, err = pool.GetInstance(time.Minute); err != nil {
			pdfEngine.err = fmt.Errorf("start the PDF reader: %w", err)
		}
	})
	return pdfEngine.inst, pdfEngine.err
}

// pdfText reads a PDF's text layer, a page at a time: Doc.Pages says where
// each page starts, and the title comes from the document's information.
func pdfText(data []byte) (Doc, error) {
	inst, err := pdfInstance()
	if err != nil {
		return Doc{}, err
	}
	pdfEngine.mu.Lock()
	defer pdfEngine.mu.Unlock()
	doc, err := inst.OpenDocument(&requests.OpenDocument{File: &data})
	if err != nil {
		if strings.Contains(err.Error(), "password") {
			return Doc{}, fmt.Errorf("%w: it needs a password (%v)", ErrEncrypted, err)
		}
		return Doc{}, fmt.Errorf("%w: pdfium: %v", ErrCorrupt, err)
	}
	defer inst.FPDF_CloseDocument(&requests.FPDF_CloseDocument{Document: doc.Document})
	n, err := inst.FPDF_GetPageCount(&requests.FPDF_GetPageCount{Document: doc.Document})
	if err != nil {
		return Doc{}, fmt.Errorf("%w: pdfium: %v", ErrCorrupt, err)
	}
	var b strings.Builder
	out := Doc{Meta: map[string]string{"pages": fmt.Sprint(n.PageCount)}}
	for i := range n.PageCount {
		t, err := inst.GetPageText(&requests.GetPageText{Page: requests.Page{
			ByIndex: &requests.PageByIndex{Document: doc.Document, Index: i}}})
		if err != nil {
			return Doc{}, fmt.Errorf("%w: page %d: %v", ErrCorrupt, i+1, err)
		}
		if b.Len() > 0 {
			b.WriteString("\n\n")
		}
		out.Pages = append(out.Pages, b.Len())
		b.WriteString(strings.TrimSpace(strings.ReplaceAll(t.Text, "\r\n", "\n")))
	}
	out.Text = b.String()
	if strings.TrimSpace(out.Text) == "" {
		return Doc{}, fmt.Errorf("%w: %d pages without a text layer (a scan needs OCR, which this build does not do)", ErrNoText, n.PageCount)
	}
	if m, err := inst.FPDF_GetMetaText(&requests.FPDF_GetMetaText{Document: doc.Document, Tag: "Title"}); err == nil {
		out.Title = strings.TrimSpace(m.Value)
	}
	return out, nil
}
