package engine

import "unicode/utf8"

// Detokenizer turns a token stream into text without ever emitting half a
// UTF-8 character: bytes of an incomplete character are held back until the
// tokens that complete it arrive.
type Detokenizer struct {
	model   Model
	pending []byte
}

// NewDetokenizer streams text for m's tokens.
func NewDetokenizer(m Model) *Detokenizer { return &Detokenizer{model: m} }

// Add appends a token and returns the text that became complete.
func (d *Detokenizer) Add(t Token) string {
	d.pending = append(d.pending, d.model.Piece(t)...)
	n := completePrefix(d.pending)
	out := string(d.pending[:n])
	d.pending = append(d.pending[:0], d.pending[n:]...)
	return out
}

// Flush returns whatever is held back, invalid bytes replaced by U+FFFD.
func (d *Detokenizer) Flush() string {
	out := string([]rune(string(d.pending)))
	d.pending = d.pending[:0]
	return out
}

// completePrefix is the length of the longest prefix of b that does not end
// inside a UTF-8 sequence that could still be completed.
func completePrefix(b []byte) int {
	// A UTF-8 character is at most 4 bytes: only the last 3 can be pending.
	for back := 1; back <= 3 && back <= len(b); back++ {
		c := b[len(b)-back]
		if c < 0x80 { // ASCII: everything up to here is complete
			return len(b)
		}
		if c >= 0xC0 { // a leading byte: is its sequence complete?
			need := 2
			switch {
			case c >= 0xF0:
				need = 4
			case c >= 0xE0:
				need = 3
			}
			if back < need && !utf8.FullRune(b[len(b)-back:]) {
				return len(b) - back
			}
			return len(b)
		}
	}
	return len(b)
}
