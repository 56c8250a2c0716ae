package retrieval

import (
	"context"
	"errors"
	"fmt"
	"net/mail"
	"strings"
	"time"
)

// Filter narrows a search to passages whose metadata match every field
// set; the zero Filter lets every passage through.
type Filter struct {
	// SourcePrefix: the passage's source starts with it.
	SourcePrefix string
	// From: the passage's "from" metadata contains it, ignoring case.
	From string
	// After and Before bound the passage's "date" metadata to [After,
	// Before); a passage without a date it can read fails a bound.
	After, Before time.Time
}

// IsZero says whether f lets every passage through.
func (f Filter) IsZero() bool {
	return f.SourcePrefix == "" && f.From == "" && f.After.IsZero() && f.Before.IsZero()
}

// Validate refuses a filter no passage can match by construction.
func (f Filter) Validate() error {
	if !f.After.IsZero() && !f.Before.IsZero() && !f.Before.After(f.After) {
		return fmt.Errorf("filter: before %s is not after after %s", f.Before.Format(time.RFC3339), f.After.Format(time.RFC3339))
	}
	return nil
}

func (f Filter) match(p *Passage) bool {
	if f.SourcePrefix != "" && !strings.HasPrefix(p.Source, f.SourcePrefix) {
		return false
	}
	if f.From != "" && !strings.Contains(strings.ToLower(p.Meta["from"]), strings.ToLower(f.From)) {
		return false
	}
	if f.After.IsZero() && f.Before.IsZero() {
		return true
	}
	d := p.date
	if d.IsZero() {
		return false
	}
	return (f.After.IsZero() || !d.Before(f.After)) && (f.Before.IsZero() || d.Before(f.Before))
}

// readDate reads a passage's "date" metadata once, as it enters the
// index: a mail's Date header, or an RFC 3339 date or day.
func (p *Passage) readDate() {
	s := strings.TrimSpace(p.Meta["date"])
	if s == "" {
		return
	}
	if t, err := mail.ParseDate(s); err == nil {
		p.date = t
		return
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			p.date = t
			return
		}
	}
}

// FilterSearcher is a Searcher that can narrow a search by metadata.
type FilterSearcher interface {
	SearchFilter(ctx context.Context, query string, k int, mode Mode, f Filter) ([]Hit, error)
}

// ErrCannotFilter: the index cannot narrow a search by metadata.
var ErrCannotFilter = errors.New("retrieval: this index cannot filter by metadata")

// SearchWith searches s, narrowed by f when f is set.
func SearchWith(ctx context.Context, s Searcher, query string, k int, mode Mode, f Filter) ([]Hit, error) {
	if f.IsZero() {
		return s.Search(ctx, query, k, mode)
	}
	fs, ok := s.(FilterSearcher)
	if !ok {
		return nil, fmt.Errorf("%w (%T)", ErrCannotFilter, s)
	}
	return fs.SearchFilter(ctx, query, k, mode, f)
}
