package engine

import "slices"

// TopK writes the k largest entries of logits into dst, largest first
// (ties: lower token id first), and returns it. It reads logits once and
// keeps a small sorted buffer, so it is cheap for k much smaller than the
// vocabulary.
func TopK(logits []float32, k int, dst []TokenLogit) []TokenLogit {
	dst = dst[:0]
	if k <= 0 {
		return dst
	}
	k = min(k, len(logits))
	for i, v := range logits {
		if len(dst) == k && v <= dst[k-1].Logit {
			continue
		}
		at, _ := slices.BinarySearchFunc(dst, v, func(e TokenLogit, v float32) int {
			if e.Logit >= v { // keep earlier (lower) ids ahead on ties
				return -1
			}
			return 1
		})
		if len(dst) < k {
			dst = append(dst, TokenLogit{})
		}
		copy(dst[at+1:], dst[at:len(dst)-1])
		dst[at] = TokenLogit{Token: Token(i), Logit: v}
	}
	return dst
}
