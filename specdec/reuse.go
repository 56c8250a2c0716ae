package specdec

// ReuseSpan implements sd.npu Eq. 3: after the first mismatch e of a draft
// (draft[e] ≠ argmax[e]), it returns the longest run [start, end), start >
// e, where the draft still equals the target's own prediction in the same
// pass (draft[i] = argmax[i]). Such a run survived a wrong prefix, so it is
// plausible text that the next step may well need (the "missing" and
// "synonym" cases of Table 2). Ties go to the earliest run, the one the
// answer reaches first. ok is false when the draft was fully accepted or no
// position after e agrees. argmax has len(draft)+1 entries as for
// VerifyGreedy; extra entries are ignored.
func ReuseSpan(draft, argmax []Token) (start, end int, ok bool) {
	n := min(len(draft), len(argmax))
	e := 0
	for e < n && draft[e] == argmax[e] {
		e++
	}
	run := 0
	for i := e + 1; i < n; i++ {
		if draft[i] != argmax[i] {
			run = 0
			continue
		}
		run++
		if run > end-start {
			start, end = i-run+1, i+1
		}
	}
	return start, end, end > start
}

// reuseHolder keeps one reusable segment between steps. A segment fits
// where the answer reaches its place, the two cases of sd.npu's Table 2
// that reuse serves:
//   - synonym: the correction replaced the rejected tokens before the
//     segment, which then continues it right away (the answer has length
//     at, the step after the one that stored it);
//   - missing: the answer first says what the draft lacked, then reaches
//     the draft token the segment followed (after).
//
// Anywhere else it is not offered: a segment offered at whatever position
// the answer happens to be (as this holder once did, until the budget ran
// out) is misaligned and almost never accepted.
type reuseHolder struct {
	seg   []Token
	spent int // drafted tokens since the segment was stored
	at    int
	after Token
}

// store replaces the held segment: it fits at answer length at and after
// the token after.
func (h *reuseHolder) store(seg []Token, at int, after Token) {
	h.seg = append(h.seg[:0], seg...)
	h.spent, h.at, h.after = 0, at, after
}

func (h *reuseHolder) clear() { h.seg, h.spent, h.at = h.seg[:0], 0, -1 }

// take returns the held segment, dropping it first if the drafts made while
// holding it already exceeded budget. A stored segment therefore survives
// at least the step after the one that stored it, where it fits as a
// synonym's continuation.
func (h *reuseHolder) take(budget int) []Token {
	if h.spent > budget {
		h.clear()
	}
	return h.seg
}
