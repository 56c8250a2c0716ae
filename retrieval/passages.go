package retrieval

import (
	"cmp"
	"slices"
)

// Passages returns copies of the index's passages in index order (by id:
// the order they were added in). Their Meta maps are shared and must not
// be modified.
func (ix *Index) Passages() []Passage {
	ix.mu.RLock()
	out := make([]Passage, 0, len(ix.passages))
	for _, p := range ix.passages {
		out = append(out, *p)
	}
	ix.mu.RUnlock()
	slices.SortFunc(out, func(a, b Passage) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
