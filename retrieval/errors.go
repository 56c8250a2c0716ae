package retrieval

import (
	"errors"
	"fmt"
)

// Errors of opening and using an index; test with errors.Is.
var (
	// ErrNoIndex: the directory holds no index.
	ErrNoIndex = errors.New("retrieval: no index")
	// ErrCorrupt: the directory holds a damaged or inconsistent index.
	ErrCorrupt = errors.New("retrieval: index is corrupt")
	// ErrEmbedder: the index needs an embedder that was not given, or was
	// built with a different one.
	ErrEmbedder = errors.New("retrieval: embedder")
	// ErrReadOnly: a write to an index opened read-only.
	ErrReadOnly = errors.New("retrieval: index opened read-only")
	// ErrNotIndexed: Delete was given a source the index does not hold.
	ErrNotIndexed = errors.New("retrieval: not in the index")
	// ErrInUse: another process (a daemon, an index command) has the
	// index open for writing.
	ErrInUse = errors.New("retrieval: index is in use by another process")
	// ErrClosed: the index was closed.
	ErrClosed = errors.New("retrieval: index closed")
)

// rebuildHint is the command that repairs any index problem.
func rebuildHint(dir string) string {
	return fmt.Sprintf("rebuild it with: dragon index build --dir %s PATHS...", dir)
}

func corrupt(dir, what string, err error) error {
	if err == nil {
		return fmt.Errorf("%w: %s: %s; %s", ErrCorrupt, dir, what, rebuildHint(dir))
	}
	return fmt.Errorf("%w: %s: %s: %w; %s", ErrCorrupt, dir, what, err, rebuildHint(dir))
}
