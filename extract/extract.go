// Package extract turns the files documents come in (PDF, HTML, DOCX)
// into text with metadata: a title, the pages of a PDF, a DOCX's tables
// as rows of cells. It is pure Go, so that the device's static arm64
// build keeps it, and knows nothing of indexes or daemons: retrieval
// chunks what it returns. A file it cannot read gives an error that says
// why (encrypted, no text layer, not a zip, over a limit), never a panic.
package extract

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"strings"
)

// Format is a file format this package reads.
type Format string

// Formats.
const (
	PDF  Format = "pdf"
	HTML Format = "html"
	DOCX Format = "docx"
)

// Doc is a file's text and what is known about it.
type Doc struct {
	Title string
	Text  string
	// Pages holds, for a paged format, the byte offset in Text where each
	// page starts: page n (from 1) at Pages[n-1].
	Pages []int
	Meta  map[string]string
}

// PageAt is the page (from 1) holding byte off of a text whose pages
// start at the given offsets, or 0 without pages.
func PageAt(pages []int, off int) int {
	n := 0
	for i, start := range pages {
		if start > off {
			break
		}
		n = i + 1
	}
	return n
}

// Errors of reading a file; test with errors.Is.
var (
	// ErrEncrypted: the file needs a password.
	ErrEncrypted = errors.New("the file is encrypted")
	// ErrNoText: the file holds no text to index (a scanned PDF without a
	// text layer, an empty page).
	ErrNoText = errors.New("no text in the file")
	// ErrTooLarge: reading the file would take more than the limits
	// allow (a zip bomb).
	ErrTooLarge = errors.New("the file expands past the limit")
	// ErrCorrupt: the file is damaged or not of its format.
	ErrCorrupt = errors.New("the file is damaged or not what its name says")
)

// Limits bound what reading one file may take.
type Limits struct {
	// Expanded bounds the bytes a compressed file (a DOCX's zip) may
	// expand to (default 256 MiB).
	Expanded int64
	// Ratio bounds a zip entry's expansion over its compressed size
	// (default 200; real XML stays well under 100).
	Ratio int64
}

func (l Limits) withDefaults() Limits {
	if l.Expanded <= 0 {
		l.Expanded = 256 << 20
	}
	if l.Ratio <= 0 {
		l.Ratio = 200
	}
	return l
}

// Detect names the format of a file from its name, then its first bytes;
// "" when it is none of this package's.
func Detect(name string, head []byte) Format {
	switch strings.ToLower(path.Ext(name)) {
	case ".pdf":
		return PDF
	case ".html", ".htm", ".xhtml":
		return HTML
	case ".docx":
		return DOCX
	}
	trimmed := bytes.TrimLeft(head, " \t\r\n\ufeff")
	switch {
	case bytes.HasPrefix(head, []byte("%PDF-")):
		return PDF
	case hasPrefixFold(trimmed, "<!doctype html") || hasPrefixFold(trimmed, "<html"):
		return HTML
	}
	return ""
}

func hasPrefixFold(b []byte, prefix string) bool {
	return len(b) >= len(prefix) && strings.EqualFold(string(b[:len(prefix)]), prefix)
}

// File extracts a file of the given format.
func File(f Format, data []byte, lim Limits) (doc Doc, err error) {
	lim = lim.withDefaults()
	// A parser's bug on a hostile file must fail the file, not the daemon.
	defer func() {
		if r := recover(); r != nil {
			doc, err = Doc{}, fmt.Errorf("%w: the %s reader failed on it (%v)", ErrCorrupt, f, r)
		}
	}()
	switch f {
	case HTML:
		doc, err = htmlText(data)
	case DOCX:
		doc, err = docxText(data, lim)
	case PDF:
		doc, err = pdfText(data)
	default:
		return Doc{}, fmt.Errorf("extract: unknown format %q", f)
	}
	if err != nil {
		return Doc{}, err
	}
	if strings.TrimSpace(doc.Text) == "" {
		return Doc{}, ErrNoText
	}
	if doc.Meta == nil {
		doc.Meta = map[string]string{}
	}
	if doc.Title != "" {
		doc.Meta["title"] = doc.Title
	}
	return doc, nil
}
