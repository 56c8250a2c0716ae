package retrieval

import (
	"bytes"
	"fmt"
	"mime"
	"net/mail"
	"path"
	"strconv"
	"strings"

	"github.com/jhillyerd/enmime/v2"

	"github.com/dragon-rag/dragon/extract"
)

// attachParser reads a mail's parts for its attachments only: the body
// and headers come from parseMessage, which agrees with it on every
// header of the mailbox and is 4-20x faster. Charset detection (80% of its
// time, and it changed no text there) and HTML conversion are off.
var attachParser = enmime.NewParser(enmime.DisableCharacterDetection(true), enmime.DisableTextConversion(true))

// maxAttachments bounds the documents one mail makes.
const maxAttachments = 32

// attachmentTypes are the content types read as documents, beside the
// file extensions extract.Detect knows.
var attachmentTypes = map[string]Kind{
	"application/pdf": KindPDF, "text/html": KindHTML,
	"application/vnd.openxmlformats-officedocument.wordprocessingml.document": KindDOCX,
	"text/plain": KindText, "text/markdown": KindMarkdown,
}

// isMultipart says whether a raw message's top-level type is multipart:
// only those carry attachments worth a second parse.
func isMultipart(raw []byte) bool {
	m, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return false
	}
	mt, _, err := mime.ParseMediaType(m.Header.Get("Content-Type"))
	return err == nil && strings.HasPrefix(mt, "multipart/")
}

// attachments are the documents a mail carries as files (PDF, HTML, DOCX
// and text attachments), each a document of its own whose source is the
// mail's and "#attachment/N/NAME", with the mail's subject, sender and
// date and its own file name. Parts without a file name are the body, and
// signatures and images carry no text; a part that cannot be read is an
// error of its own, next to the others.
func attachments(source, filePath string, raw []byte, msg message) ([]Document, []FileError) {
	if !isMultipart(raw) {
		return nil, nil
	}
	env, err := attachParser.ReadEnvelope(bytes.NewReader(raw))
	if err != nil {
		return nil, []FileError{{source, fmt.Errorf("attachments: %w", err)}}
	}
	var parts []*enmime.Part
	parts = append(parts, env.Attachments...)
	for _, p := range append(env.Inlines, env.OtherParts...) {
		if p.FileName != "" {
			parts = append(parts, p)
		}
	}
	var docs []Document
	var errs []FileError
	for i, p := range parts {
		if len(docs) == maxAttachments {
			errs = append(errs, FileError{source, fmt.Errorf("more than %d attachments: the rest are left out", maxAttachments)})
			break
		}
		kind := attachmentKind(p)
		if kind == 0 {
			continue
		}
		name := p.FileName
		if name == "" {
			name = "part"
		}
		src := source + "#attachment/" + strconv.Itoa(i+1) + "/" + path.Base(strings.ReplaceAll(name, "\\", "/"))
		ds, _, err := documentsOf(src, filePath, kind, p.Content)
		if err != nil {
			errs = append(errs, FileError{src, err})
			continue
		}
		for _, d := range ds {
			for k, v := range map[string]string{"subject": msg.Subject, "from": msg.From, "date": msg.Date, "message_id": msg.MessageID, "attached_to": source, "filename": name} {
				if v != "" {
					d.Meta[k] = v
				}
			}
			docs = append(docs, d)
		}
	}
	return docs, errs
}

// attachmentKind is the kind a part is read as, or 0.
func attachmentKind(p *enmime.Part) Kind {
	switch extract.Detect(p.FileName, p.Content[:min(len(p.Content), 512)]) {
	case extract.PDF:
		return KindPDF
	case extract.HTML:
		return KindHTML
	case extract.DOCX:
		return KindDOCX
	}
	if k, ok := attachmentTypes[strings.ToLower(p.ContentType)]; ok {
		return k
	}
	switch strings.ToLower(path.Ext(p.FileName)) {
	case ".txt", ".md", ".text":
		return KindText
	}
	return 0
}
