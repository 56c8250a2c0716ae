package ggufgen

import (
	"fmt"
	"sync"
)

// Token types of tokenizer.ggml.token_type (llama.cpp's llama_token_type).
const (
	tokenTypeNormal  = 1
	tokenTypeControl = 3
)

// specials come first so that their ids match SmolLM2's.
var specials = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// mergeList holds the merges by rank. Both halves of each are byte symbols or earlier results,
// and every result becomes a vocabulary token: llama.cpp applies a merge
// only by rank and then looks the merged text up, falling back to bytes, so
// a merge without its token would be dead weight. "Ġ" is GPT-2's symbol for
// the space byte, "Ċ" for the newline.
var mergeList = [][2]string{
	{"Ġ", "t"}, {"Ġ", "a"}, {"h", "e"}, {"i", "n"}, {"r", "e"}, {"o", "n"},
	{"Ġt", "he"}, {"e", "r"}, {"Ġ", "s"}, {"a", "t"}, {"Ġ", "w"},
	{"n", "d"}, {"o", "u"}, {"e", "n"}, {"e", "s"}, {"o", "r"}, {"Ġ", "o"},
	{"Ġ", "c"}, {"i", "s"}, {"a", "n"}, {"i", "t"}, {"Ġ", "b"}, {"Ġ", "f"},
	{"Ġ", "p"}, {"Ġ", "m"}, {"l", "l"}, {"e", "d"}, {"a", "r"}, {"Ġ", "h"},
	{"in", "g"}, {"Ġ", "d"}, {"l", "e"}, {"Ġ", "i"}, {"Ġa", "nd"},
	{"Ġo", "f"}, {"Ġt", "o"}, {"Ġi", "n"}, {"Ġi", "s"}, {"he", "ll"},
	{"hell", "o"}, {"l", "d"}, {"Ġw", "or"}, {"Ġwor", "ld"}, {"t", "h"},
	{"t", "he"}, {"i", "on"}, {"Ġ", "r"}, {"Ġ", "e"}, {"Ġ", "n"}, {"Ġ", "l"},
	{"Ġ", "g"}, {"o", "w"}, {"a", "l"}, {"i", "c"}, {"s", "t"}, {"Ġw", "h"},
	{"Ġwh", "at"}, {"Ġ", "y"}, {"Ġy", "ou"}, {"Ġ", "I"}, {"Ġ", "T"},
	{"Ġ", "A"}, {"'", "s"}, {"Ċ", "Ċ"}, {"Ġ", "Ġ"},
}

// vocab returns tokenizer.ggml.tokens, .token_type and .merges; built once,
// read-only afterwards.
func vocab() (tokens []string, types []int32, merges []string) {
	v := builtVocab()
	return v.tokens, v.types, v.merges
}

type vocabulary struct {
	tokens []string
	types  []int32
	merges []string
}

var builtVocab = sync.OnceValue(func() vocabulary {
	var tokens []string
	var types []int32
	seen := map[string]bool{}
	add := func(s string, typ int32) {
		if seen[s] {
			panic(fmt.Sprintf("ggufgen: duplicate token %q", s))
		}
		seen[s] = true
		tokens = append(tokens, s)
		types = append(types, typ)
	}
	for _, s := range specials {
		add(s, tokenTypeControl)
	}
	sym := byteSymbols()
	for b := range 256 {
		add(sym[b], tokenTypeNormal)
	}
	merges := make([]string, len(mergeList))
	for i, m := range mergeList {
		if !seen[m[0]] || !seen[m[1]] {
			panic(fmt.Sprintf("ggufgen: merge %q %q uses an unknown token", m[0], m[1]))
		}
		merges[i] = m[0] + " " + m[1]
		add(m[0]+m[1], tokenTypeNormal)
	}
	return vocabulary{tokens, types, merges}
})

// VocabSize is the number of tokens of every generated model.
func VocabSize() int {
	tokens, _, _ := vocab()
	return len(tokens)
}

// byteSymbols is GPT-2's bytes_to_unicode: printable Latin-1 bytes stand
// for themselves, the other 68 (controls, space, 0x7f-0xa0, soft hyphen)
// map to U+0100 onwards in byte order, so that every token is printable
// text without spaces (the merges file separates halves with a space).
func byteSymbols() [256]string {
	var sym [256]string
	n := 0
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff) {
			sym[b] = string(rune(b))
		} else {
			sym[b] = string(rune(256 + n))
			n++
		}
	}
	return sym
}
