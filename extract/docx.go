package extract

import (
	"archive/zip"
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
)

// docxText reads a Word document: the paragraphs of its body, a line
// each, and its tables as rows of " | "-separated cells; the title from
// its core properties. Every zip entry it reads is bounded by the limits,
// so a zip bomb fails with ErrTooLarge after at most lim.Expanded bytes.
func docxText(data []byte, lim Limits) (Doc, error) {
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return Doc{}, fmt.Errorf("%w: not a zip archive, as a DOCX is (%v)", ErrCorrupt, err)
	}
	budget := lim.Expanded
	read := func(name string) ([]byte, error) {
		for _, f := range zr.File {
			if f.Name != name {
				continue
			}
			if f.CompressedSize64 > 0 && f.UncompressedSize64/f.CompressedSize64 > uint64(lim.Ratio) {
				return nil, fmt.Errorf("%w: %s claims to expand %d times", ErrTooLarge, name, f.UncompressedSize64/f.CompressedSize64)
			}
			rc, err := f.Open()
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, name, err)
			}
			defer rc.Close()
			// The header's sizes can lie: the bytes read are what count.
			b, err := io.ReadAll(io.LimitReader(rc, budget+1))
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, name, err)
			}
			if int64(len(b)) > budget {
				return nil, fmt.Errorf("%w: %s expands past %d bytes", ErrTooLarge, name, lim.Expanded)
			}
			if f.CompressedSize64 > 0 && uint64(len(b))/f.CompressedSize64 > uint64(lim.Ratio) {
				return nil, fmt.Errorf("%w: %s expands %d times", ErrTooLarge, name, uint64(len(b))/f.CompressedSize64)
			}
			budget -= int64(len(b))
			return b, nil
		}
		return nil, nil
	}
	body, err := read("word/document.xml")
	if err != nil {
		return Doc{}, err
	}
	if body == nil {
		return Doc{}, fmt.Errorf("%w: a zip without word/document.xml is not a DOCX", ErrCorrupt)
	}
	text, err := docxBody(body)
	if err != nil {
		return Doc{}, err
	}
	doc := Doc{Text: text, Meta: map[string]string{}}
	if core, err := read("docProps/core.xml"); err == nil && core != nil {
		doc.Title, doc.Meta["author"] = coreProps(core)
		if doc.Meta["author"] == "" {
			delete(doc.Meta, "author")
		}
	}
	return doc, nil
}

// docxBody walks document.xml: w:t runs make text, w:tab and w:br space
// and breaks, w:p ends a line, and the cells (w:tc) of a table row (w:tr)
// are joined on one line. A table inside a cell is part of its cell.
func docxBody(data []byte) (string, error) {
	dec := xml.NewDecoder(bytes.NewReader(data))
	var out, para, cell strings.Builder
	var row []string
	depth := 0 // nesting of w:tc
	inText := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("%w: word/document.xml: %v", ErrCorrupt, err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			switch t.Name.Local {
			case "t":
				inText = true
			case "tab":
				para.WriteByte('\t')
			case "br", "cr":
				para.WriteByte('\n')
			case "tc":
				depth++
			}
		case xml.EndElement:
			switch t.Name.Local {
			case "t":
				inText = false
			case "p":
				p := strings.TrimSpace(para.String())
				para.Reset()
				switch {
				case p == "":
				case depth > 0:
					if cell.Len() > 0 {
						cell.WriteByte(' ')
					}
					cell.WriteString(p)
				default:
					out.WriteString(p)
					out.WriteByte('\n')
				}
			case "tc":
				depth--
				if depth == 0 {
					row = append(row, cell.String())
					cell.Reset()
				}
			case "tr":
				if depth > 0 {
					continue // a row of a table inside a cell
				}
				if line := strings.Trim(strings.Join(row, " | "), " |"); line != "" {
					out.WriteString(line)
					out.WriteByte('\n')
				}
				row = row[:0]
			}
		case xml.CharData:
			if inText {
				para.Write(t)
			}
		}
	}
	return strings.TrimSpace(out.String()), nil
}

// coreProps reads the title and creator of docProps/core.xml.
func coreProps(data []byte) (title, author string) {
	var core struct {
		Title   string `xml:"title"`
		Creator string `xml:"creator"`
	}
	if xml.Unmarshal(data, &core) != nil {
		return "", ""
	}
	return strings.TrimSpace(core.Title), strings.TrimSpace(core.Creator)
}
