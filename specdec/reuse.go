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

// reuseHolder keeps one reusable segment between steps.
type reuseHolder struct {
	seg   []Token
	spent int // drafted tokens since the segment was stored
}

// store replaces the held segment.
func (h *reuseHolder) store(seg []Token) {
	h.seg = append(h.seg[:0], seg...)
	h.spent = 0
}

func (h *reuseHolder) clear() { h.seg, h.spent = h.seg[:0], 0 }

// take returns the held segment, dropping it first if the drafts made while
// holding it already exceeded budget. A stored segment is therefore always
// offered at least once.
func (h *reuseHolder) take(budget int) []Token {
	if h.spent > budget {
		h.clear()
	}
	return h.seg
}
