package retrieval

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"net/textproto"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/html"
	"golang.org/x/text/encoding/htmlindex"
)

// maxMIMEDepth bounds multipart nesting, so a hostile message cannot make
// the parser recurse without end.
const maxMIMEDepth = 8

// message is the retrievable part of one mail message.
type message struct {
	Subject, From, Date, MessageID string
	Body                           string
}

// errNoText: the message has neither a text/plain nor a text/html part.
var errNoText = errors.New("no text/plain or text/html body")

// parseMessage reads one RFC 822 message. A leading mbox "From " envelope
// line is tolerated, since single messages are often saved with it.
func parseMessage(raw []byte) (message, error) {
	if bytes.HasPrefix(raw, []byte("From ")) {
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			raw = raw[i+1:]
		}
	}
	m, err := mail.ReadMessage(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil {
		return message{}, fmt.Errorf("parse mail: %w", err)
	}
	dec := mime.WordDecoder{CharsetReader: charsetReader}
	header := func(k string) string {
		v := m.Header.Get(k)
		if d, err := dec.DecodeHeader(v); err == nil {
			v = d
		}
		return strings.Join(strings.Fields(toValidUTF8(v)), " ")
	}
	out := message{
		Subject:   header("Subject"),
		From:      header("From"),
		Date:      header("Date"),
		MessageID: strings.Trim(header("Message-Id"), "<>"),
	}
	plain, htmlText, err := partText(textproto.MIMEHeader(m.Header), m.Body, 0)
	if err != nil {
		return out, err
	}
	body := plain
	if strings.TrimSpace(body) == "" {
		body = htmlText
	}
	if strings.TrimSpace(body) == "" {
		return out, errNoText
	}
	out.Body = strings.ReplaceAll(body, "\r\n", "\n")
	return out, nil
}

// partText returns the decoded text/plain and text/html content of a MIME
// entity, descending into multipart containers. Attachments are skipped.
func partText(h textproto.MIMEHeader, body io.Reader, depth int) (plain, htmlText string, err error) {
	if depth > maxMIMEDepth {
		return "", "", fmt.Errorf("MIME nesting deeper than %d", maxMIMEDepth)
	}
	mediaType, params, perr := mime.ParseMediaType(h.Get("Content-Type"))
	if perr != nil {
		// RFC 2045: a missing or broken Content-Type means plain ASCII text.
		mediaType, params = "text/plain", map[string]string{}
	}
	if disp, _, err := mime.ParseMediaType(h.Get("Content-Disposition")); err == nil && disp == "attachment" {
		return "", "", nil
	}
	switch {
	case strings.HasPrefix(mediaType, "multipart/"):
		return multipartText(params["boundary"], body, depth)
	case mediaType == "text/plain", mediaType == "text/html":
		raw, err := io.ReadAll(body)
		if err != nil && (len(raw) == 0 || !errors.Is(err, io.ErrUnexpectedEOF)) {
			return "", "", fmt.Errorf("read %s body: %w", mediaType, err)
		}
		// A truncated message (no closing boundary) keeps what it has.
		data, err := decodeTransfer(h.Get("Content-Transfer-Encoding"), raw)
		if err != nil {
			return "", "", fmt.Errorf("decode %s body: %w", mediaType, err)
		}
		text := decodeCharset(data, params["charset"])
		if mediaType == "text/html" {
			return "", htmlToText(text), nil
		}
		return text, "", nil
	}
	return "", "", nil
}

func multipartText(boundary string, body io.Reader, depth int) (plain, htmlText string, err error) {
	if boundary == "" {
		return "", "", errors.New("multipart body without boundary")
	}
	mr := multipart.NewReader(body, boundary)
	var plains, htmls []string
	for {
		// NextRawPart: NextPart would decode quoted-printable itself and drop
		// the header, and we decode every transfer encoding in one place.
		p, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if len(plains)+len(htmls) > 0 {
				break // a truncated last part: keep what was read
			}
			return "", "", fmt.Errorf("read multipart: %w", err)
		}
		pl, ht, err := partText(p.Header, p, depth+1)
		if err != nil {
			return "", "", err
		}
		if strings.TrimSpace(pl) != "" {
			plains = append(plains, pl)
		}
		if strings.TrimSpace(ht) != "" {
			htmls = append(htmls, ht)
		}
	}
	return strings.Join(plains, "\n\n"), strings.Join(htmls, "\n\n"), nil
}

// decodeTransfer undoes a Content-Transfer-Encoding. Real mail is often
// slightly broken ("=====" rules in quoted-printable, a cut base64 tail),
// so a damaged body decodes as far as it can instead of being lost.
func decodeTransfer(cte string, raw []byte) ([]byte, error) {
	switch strings.ToLower(strings.TrimSpace(cte)) {
	case "quoted-printable":
		if out, err := io.ReadAll(quotedprintable.NewReader(bytes.NewReader(raw))); err == nil {
			return out, nil
		}
		return lenientQP(raw), nil
	case "base64":
		out, err := io.ReadAll(base64.NewDecoder(base64.StdEncoding, &skipSpace{r: bytes.NewReader(raw)}))
		if err != nil && len(out) == 0 {
			return nil, err
		}
		return out, nil
	}
	return raw, nil
}

// lenientQP decodes "=XX" escapes and "=" soft line breaks and keeps any
// other "=" as it is. An "=" right after a literal one is literal too, so
// that "=====" rule lines, common in unencoded text labelled
// quoted-printable, keep their line break.
func lenientQP(raw []byte) []byte {
	out := make([]byte, 0, len(raw))
	literalEq := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '=' {
			out = append(out, c)
			literalEq = false
			continue
		}
		rest := raw[i+1:]
		switch {
		case literalEq:
			out = append(out, c)
		case bytes.HasPrefix(rest, []byte("\r\n")):
			i += 2
		case bytes.HasPrefix(rest, []byte("\n")):
			i++
		case len(rest) >= 2 && isHex(rest[0]) && isHex(rest[1]):
			out = append(out, unhex(rest[0])<<4|unhex(rest[1]))
			i += 2
		default:
			out = append(out, c)
			literalEq = true
		}
	}
	return out
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' || 'a' <= c && c <= 'f'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// skipSpace drops the line breaks (and stray blanks) base64 bodies carry.
type skipSpace struct{ r io.Reader }

func (s *skipSpace) Read(p []byte) (int, error) {
	for {
		n, err := s.r.Read(p)
		j := 0
		for _, c := range p[:n] {
			if c != '\r' && c != '\n' && c != ' ' && c != '\t' {
				p[j] = c
				j++
			}
		}
		if j > 0 || err != nil {
			return j, err
		}
	}
}

// decodeCharset converts text in the named charset to UTF-8. Unknown
// charsets and invalid bytes degrade to U+FFFD rather than failing.
// 8-bit text labelled US-ASCII (or not labelled) that is not UTF-8 is read
// as Windows-1252, the usual culprit.
func decodeCharset(data []byte, charset string) string {
	cs := strings.ToLower(strings.TrimSpace(charset))
	if (cs == "" || cs == "us-ascii") && !utf8.Valid(data) {
		cs = "windows-1252"
	}
	if cs != "" && cs != "utf-8" && cs != "utf8" && cs != "us-ascii" {
		if enc, err := htmlindex.Get(cs); err == nil {
			if out, err := enc.NewDecoder().Bytes(data); err == nil {
				data = out
			}
		}
	}
	return toValidUTF8(string(data))
}

func charsetReader(charset string, input io.Reader) (io.Reader, error) {
	enc, err := htmlindex.Get(charset)
	if err != nil {
		return nil, fmt.Errorf("charset %q: %w", charset, err)
	}
	return enc.NewDecoder().Reader(input), nil
}

func toValidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// htmlToText keeps the visible text of an HTML body, with a line break
// after block elements. It is a fallback for mail without a text/plain
// part, not a renderer.
func htmlToText(s string) string {
	z := html.NewTokenizer(strings.NewReader(s))
	var b strings.Builder
	skip := 0
	for {
		switch z.Next() {
		case html.ErrorToken:
			return strings.TrimSpace(b.String())
		case html.StartTagToken:
			name, _ := z.TagName()
			switch string(name) {
			case "script", "style", "title":
				skip++
			case "body":
				skip = 0 // an unclosed <title> or <style> in the head ends here
			case "br", "p", "div", "tr", "li", "h1", "h2", "h3", "h4", "h5", "h6":
				b.WriteByte('\n')
			}
		case html.EndTagToken:
			name, _ := z.TagName()
			switch string(name) {
			case "script", "style", "title":
				skip = max(0, skip-1)
			case "p", "div", "tr", "li", "table", "h1", "h2", "h3", "h4", "h5", "h6":
				b.WriteByte('\n')
			}
		case html.TextToken:
			if skip == 0 {
				line := strings.Join(strings.Fields(string(z.Text())), " ")
				if line != "" {
					b.WriteString(line)
					b.WriteByte(' ')
				}
			}
		}
	}
}
