package retrieval

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/dragon-rag/dragon/extract"
)

// Kind is the format of a source file.
type Kind int

// Kinds start at 1 so the zero value means "unknown".
const (
	KindText Kind = 1 + iota
	KindMarkdown
	KindMail
	KindMbox
	KindPDF
	KindHTML
	KindDOCX
)

func (k Kind) String() string {
	switch k {
	case KindText:
		return "text"
	case KindMarkdown:
		return "markdown"
	case KindMail:
		return "mail"
	case KindMbox:
		return "mbox"
	case KindPDF:
		return "pdf"
	case KindHTML:
		return "html"
	case KindDOCX:
		return "docx"
	}
	return "unknown"
}

// Document is one retrievable unit before chunking: a text file, or one
// mail message.
type Document struct {
	// Source names the document: the file's absolute path, or path#N for
	// message N (from 1) of an mbox.
	Source string
	Path   string // the file it was read from
	Kind   Kind
	// Text is what passages' byte offsets point into: the file itself for
	// UTF-8 text and Markdown, the decoded text body for mail.
	Text string
	Meta map[string]string // subject, from, date, message_id, title
	// Pages holds, for a paged document (a PDF), the byte offset in Text
	// where each page starts; its passages carry the page they start on.
	Pages []int
}

// FileError is a file (or mbox message) that could not be ingested.
type FileError struct {
	Path string
	Err  error
}

func (e FileError) Error() string { return e.Path + ": " + e.Err.Error() }

// errUnsupported marks files of no format ingestion reads.
var errUnsupported = errors.New("unsupported file type")

// maxFileSize bounds what is read into memory as one text or mail file;
// mbox files are streamed and have no bound.
const maxFileSize = 256 << 20

// walk expands paths (files and folders) into a sorted list of regular
// files. Hidden entries inside folders and the folders in exclude are
// skipped; errors are collected, never fatal.
func walk(paths, exclude []string) ([]string, []FileError) {
	skip := map[string]bool{}
	for _, e := range exclude {
		if abs, err := filepath.Abs(e); err == nil {
			skip[abs] = true
		}
	}
	var files []string
	var errs []FileError
	seen := map[string]bool{}
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			files = append(files, p)
		}
	}
	for _, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			errs = append(errs, FileError{p, err})
			continue
		}
		// A path named on the command line is followed even when it is a
		// link to a folder (links met inside are not: no cycles); what
		// is found keeps the name given.
		root := abs
		if target, err := filepath.EvalSymlinks(abs); err == nil && target != abs {
			if info, err := os.Stat(target); err == nil && info.IsDir() {
				root = target
			}
		}
		err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if root != abs {
				rel, rerr := filepath.Rel(root, path)
				if rerr != nil {
					return rerr
				}
				path = filepath.Join(abs, rel)
			}
			if err != nil {
				errs = append(errs, FileError{path, err})
				if d != nil && d.IsDir() && path != abs {
					return fs.SkipDir
				}
				return nil
			}
			if d.IsDir() && skip[path] {
				return fs.SkipDir
			}
			if path != abs && strings.HasPrefix(d.Name(), ".") {
				if d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			switch {
			case d.Type().IsRegular():
				add(path)
			case d.Type()&fs.ModeSymlink != 0:
				// Follow links to files, not to folders (no cycles); a
				// dangling link is an unreadable file.
				info, err := os.Stat(path)
				if err != nil {
					errs = append(errs, FileError{path, err})
				} else if info.Mode().IsRegular() {
					add(path)
				}
			}
			return nil
		})
		if err != nil {
			errs = append(errs, FileError{abs, err})
		}
	}
	sort.Strings(files)
	return files, errs
}

var headerLine = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9-]*:[ \t]`)

// detectKind picks a file's format from its name, then from its first
// bytes.
func detectKind(path string, head []byte) (Kind, error) {
	switch extract.Detect(path, head) {
	case extract.PDF:
		return KindPDF, nil
	case extract.HTML:
		return KindHTML, nil
	case extract.DOCX:
		return KindDOCX, nil
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".md", ".markdown", ".mdown", ".mkd":
		return KindMarkdown, nil
	case ".eml":
		return KindMail, nil
	case ".mbox", ".mbx":
		return KindMbox, nil
	case ".txt", ".text":
		return KindText, nil
	}
	if bytes.IndexByte(head, 0) >= 0 {
		return 0, errUnsupported
	}
	if bytes.HasPrefix(head, []byte("From ")) {
		// An mbox, or a single message saved with its envelope line: the
		// mbox reader handles both.
		return KindMbox, nil
	}
	firstLine, _, _ := bytes.Cut(head, []byte("\n"))
	if headerLine.Match(firstLine) && looksLikeMail(head) {
		return KindMail, nil
	}
	if !validUTF8Prefix(head) {
		return 0, errUnsupported
	}
	return KindText, nil
}

func looksLikeMail(head []byte) bool {
	h := bytes.ToLower(head)
	n := 0
	for _, k := range []string{"\nfrom:", "\nsubject:", "\ndate:", "\nmessage-id:", "\nreceived:", "\nto:", "\nreturn-path:"} {
		if bytes.Contains(h, []byte(k)) || bytes.HasPrefix(h, []byte(k[1:])) {
			n++
		}
	}
	return n >= 2
}

// validUTF8Prefix is utf8.Valid, forgiving a character cut at the end of
// the sniffed prefix.
func validUTF8Prefix(b []byte) bool {
	for i := 0; i < utf8.UTFMax && len(b) > 0; i++ {
		if utf8.Valid(b) {
			return true
		}
		b = b[:len(b)-1]
	}
	return utf8.Valid(b)
}

// readDocuments reads the documents of one file. A failure of the whole
// file is the error; failures of single messages of an mbox come back as
// FileErrors next to the messages that were read.
func readDocuments(path string) ([]Document, []FileError, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	head := make([]byte, 4096)
	n, err := f.Read(head)
	if err != nil && n == 0 && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	head = head[:n]
	kind, err := detectKind(path, head)
	if err != nil {
		return nil, nil, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		return nil, nil, err
	}
	if kind == KindMbox {
		return readMbox(path, path, f)
	}
	data, err := readAllLimited(f, maxFileSize)
	if err != nil {
		return nil, nil, err
	}
	return documentsOf(path, path, kind, data)
}

// documentsFrom reads the documents of a file given as bytes (a document
// API upload, named source) and says what kind of file it is.
func documentsFrom(source string, data []byte) (Kind, []Document, []FileError, error) {
	if len(data) == 0 {
		return 0, nil, nil, errors.New("the file is empty")
	}
	if int64(len(data)) > maxFileSize {
		return 0, nil, nil, fmt.Errorf("the file is larger than the %d bytes a single document may have", maxFileSize)
	}
	kind, err := detectKind(source, data[:min(len(data), 4096)])
	if err != nil {
		return 0, nil, nil, err
	}
	var docs []Document
	var errs []FileError
	if kind == KindMbox {
		docs, errs, err = readMbox(source, source, bytes.NewReader(data))
	} else {
		docs, errs, err = documentsOf(source, source, kind, data)
	}
	return kind, docs, errs, err
}

// extractFormats are the kinds package extract reads.
var extractFormats = map[Kind]extract.Format{KindPDF: extract.PDF, KindHTML: extract.HTML, KindDOCX: extract.DOCX}

// documentsOf reads a file of a known kind other than mbox.
func documentsOf(source, path string, kind Kind, data []byte) ([]Document, []FileError, error) {
	switch kind {
	case KindPDF, KindHTML, KindDOCX:
		d, err := extract.File(extractFormats[kind], data, extract.Limits{Expanded: maxFileSize})
		if err != nil {
			return nil, nil, err
		}
		return []Document{{Source: source, Path: path, Kind: kind, Text: d.Text, Meta: d.Meta, Pages: d.Pages}}, nil, nil
	case KindMail:
		docs, errs, err := mailDocuments(source, path, data)
		return docs, errs, err
	default:
		doc := Document{Source: source, Path: path, Kind: kind, Text: string(data), Meta: map[string]string{}}
		if !utf8.Valid(data) {
			// Offsets then point into the repaired text, not the file.
			doc.Text = decodeCharset(data, "windows-1252")
			doc.Meta["encoding"] = "windows-1252"
		}
		if kind == KindMarkdown {
			if t := markdownTitle(doc.Text); t != "" {
				doc.Meta["title"] = t
			}
		}
		return []Document{doc}, nil, nil
	}
}

func readMbox(source, path string, r io.Reader) ([]Document, []FileError, error) {
	var docs []Document
	var errs []FileError
	err := splitMbox(r, func(n int, raw []byte) error {
		part := source + "#" + strconv.Itoa(n)
		ds, aerrs, err := mailDocuments(part, path, raw)
		errs = append(errs, aerrs...)
		if err != nil {
			errs = append(errs, FileError{part, err})
			return nil
		}
		docs = append(docs, ds...)
		return nil
	})
	if err != nil && len(docs) == 0 {
		return nil, errs, err
	}
	if err != nil {
		errs = append(errs, FileError{source, err})
	}
	return docs, errs, nil
}

// mailDocuments reads one message: its body, and its attachments as
// documents of their own. A mail whose only content is attachments is
// kept for them.
func mailDocuments(source, path string, raw []byte) ([]Document, []FileError, error) {
	m, err := parseMessage(raw)
	if err != nil && !errors.Is(err, errNoText) {
		return nil, nil, err
	}
	var docs []Document
	if err == nil {
		docs = append(docs, mailDocument(source, path, m))
	}
	atts, errs := attachments(source, path, raw, m)
	if len(docs)+len(atts) == 0 {
		return nil, errs, errNoText
	}
	return append(docs, atts...), errs, nil
}

func mailDocument(source, path string, m message) Document {
	meta := map[string]string{}
	for k, v := range map[string]string{"subject": m.Subject, "from": m.From, "date": m.Date, "message_id": m.MessageID} {
		if v != "" {
			meta[k] = v
		}
	}
	return Document{Source: source, Path: path, Kind: KindMail, Text: m.Body, Meta: meta}
}

// markdownTitle is the text of the first ATX heading, if any.
func markdownTitle(text string) string {
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			return strings.TrimSpace(strings.TrimLeft(line, "#"))
		}
	}
	return ""
}

func readAllLimited(f *os.File, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("file is larger than the %d bytes a single document may have", limit)
	}
	return data, nil
}
