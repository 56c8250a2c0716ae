package decoder

import (
	"fmt"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/kvcache"
)

// headProbes are questions that share nothing after "Question: ": the
// common token prefix of their prompts over one passage is the part of
// the prompt no question changes.
var headProbes = []string{"a", "?"}

// PassageHead is the head of a passage sequence's prompt: the tokens that
// the prompt of any question over passage text shares (the system turn,
// the history before the question, the passage), under this decoder's
// system message and history, in output aggregation. A cache entry that
// holds the head serves every later question over the passage: a
// kvcache.Cache warmed by Begin over the passage with any question holds
// it, and Cache.Has(head) tells whether it does. It prefills nothing; do
// not call it while a generation of this decoder runs on another
// goroutine.
func (d *Decoder) PassageHead(text string) ([]engine.Token, error) {
	saved, mode := d.passages, d.mode
	d.passages, d.mode = []Passage{{Text: text}}, OutputAggregation
	defer func() { d.passages, d.mode = saved, mode }()
	var head []engine.Token
	for i, q := range headProbes {
		texts, _ := d.promptTexts(q)
		toks, err := d.model.Tokenize(texts[0], true, true)
		if err != nil {
			return nil, fmt.Errorf("decoder: tokenize prompt: %w", err)
		}
		if i == 0 {
			head = toks
		} else {
			head = head[:kvcache.CommonPrefix(head, toks)]
		}
	}
	return head, nil
}
