package extract

import (
	"bytes"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/net/html"
	"golang.org/x/net/html/atom"
	"golang.org/x/net/html/charset"
)

// skipped are elements whose content a reader never sees as the page's
// text: code and styling, and the page's chrome (navigation, forms).
var skipped = map[atom.Atom]bool{
	atom.Script: true, atom.Style: true, atom.Noscript: true, atom.Template: true,
	atom.Head: true, atom.Svg: true, atom.Math: true, atom.Iframe: true, atom.Object: true,
	atom.Nav: true, atom.Form: true, atom.Button: true, atom.Select: true, atom.Textarea: true,
}

// blocks break the text: a paragraph, heading, list item or table row
// starts a line of its own.
var blocks = map[atom.Atom]bool{
	atom.P: true, atom.Div: true, atom.Section: true, atom.Article: true, atom.Main: true,
	atom.H1: true, atom.H2: true, atom.H3: true, atom.H4: true, atom.H5: true, atom.H6: true,
	atom.Li: true, atom.Ul: true, atom.Ol: true, atom.Dl: true, atom.Dt: true, atom.Dd: true,
	atom.Table: true, atom.Tr: true, atom.Blockquote: true, atom.Pre: true, atom.Br: true,
	atom.Hr: true, atom.Header: true, atom.Footer: true, atom.Aside: true, atom.Figure: true,
	atom.Figcaption: true, atom.Address: true, atom.Caption: true, atom.Tbody: true, atom.Thead: true,
}

// htmlText is a page's visible text, a block per line, and its title (the
// <title>, else the first heading). Hidden elements are dropped with
// their content.
func htmlText(data []byte) (Doc, error) {
	r, err := charset.NewReader(bytes.NewReader(data), "text/html")
	if err != nil {
		return Doc{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	root, err := html.Parse(r)
	if err != nil {
		return Doc{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	w := &textWriter{lineStart: true}
	var title, heading string
	var walk func(n *html.Node, pre bool)
	walk = func(n *html.Node, pre bool) {
		switch n.Type {
		case html.TextNode:
			w.text(n.Data, pre)
			return
		case html.ElementNode:
			if skipped[n.DataAtom] || hidden(n) {
				return
			}
			if heading == "" && (n.DataAtom == atom.H1 || n.DataAtom == atom.H2) {
				heading = collapse(nodeText(n))
			}
			pre = pre || n.DataAtom == atom.Pre
			if n.DataAtom == atom.Td || n.DataAtom == atom.Th {
				w.cell()
			}
		}
		block := n.Type == html.ElementNode && blocks[n.DataAtom]
		if block {
			w.newline()
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c, pre)
		}
		if block {
			w.newline()
		}
	}
	walk(root, false)
	if t := find(root, atom.Title); t != nil {
		title = collapse(nodeText(t))
	}
	if title == "" {
		title = heading
	}
	return Doc{Title: title, Text: w.String()}, nil
}

// hidden says whether an element is marked as not shown.
func hidden(n *html.Node) bool {
	for _, a := range n.Attr {
		switch strings.ToLower(a.Key) {
		case "hidden":
			return true
		case "aria-hidden":
			if strings.EqualFold(a.Val, "true") {
				return true
			}
		case "style":
			s := strings.ReplaceAll(strings.ToLower(a.Val), " ", "")
			if strings.Contains(s, "display:none") || strings.Contains(s, "visibility:hidden") {
				return true
			}
		case "role":
			if strings.EqualFold(a.Val, "navigation") {
				return true
			}
		}
	}
	return false
}

// find is the first element of the kind under n, depth first.
func find(n *html.Node, a atom.Atom) *html.Node {
	if n.Type == html.ElementNode && n.DataAtom == a {
		return n
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if f := find(c, a); f != nil {
			return f
		}
	}
	return nil
}

func nodeText(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return b.String()
}

// collapse joins s's words with single spaces, leaving out the icon
// glyphs of private-use code points (a heading's permalink sign).
func collapse(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Co, r) {
			return -1
		}
		return r
	}, s)
	return strings.Join(strings.Fields(s), " ")
}

// textWriter collects text with collapsed white space, lines between
// blocks and " | " between table cells.
type textWriter struct {
	b           strings.Builder
	space       bool // the last text ended in white space
	lineStart   bool // nothing written on this line yet
	afterSep    bool // a cell separator was just written
	cellsInLine int
}

func (w *textWriter) text(s string, pre bool) {
	if pre {
		w.b.WriteString(s)
		w.space, w.afterSep = false, false
		w.lineStart = strings.HasSuffix(s, "\n")
		return
	}
	for i, f := range strings.Fields(s) {
		if (i > 0 || w.space || startsWithSpace(s)) && !w.lineStart && !w.afterSep {
			w.b.WriteByte(' ')
		}
		w.b.WriteString(f)
		w.lineStart, w.afterSep = false, false
	}
	w.space = endsWithSpace(s)
}

func (w *textWriter) cell() {
	if w.cellsInLine > 0 && !w.lineStart {
		w.b.WriteString(" | ")
		w.afterSep = true
	}
	w.cellsInLine++
}

func (w *textWriter) newline() {
	if w.b.Len() > 0 && !w.lineStart {
		w.b.WriteByte('\n')
	}
	w.lineStart, w.space, w.afterSep, w.cellsInLine = true, false, false, 0
}

func (w *textWriter) String() string { return strings.TrimSpace(w.b.String()) }

func startsWithSpace(s string) bool { return s != "" && strings.TrimLeft(s, " \t\r\n\f") != s }
func endsWithSpace(s string) bool   { return s != "" && strings.TrimRight(s, " \t\r\n\f") != s }
