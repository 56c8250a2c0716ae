package library

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/dragon-rag/dragon/retrieval"
)

// Watch options.
const (
	// watchQuiet is how long a folder must be still after a change before
	// it is synced: an editor's save or a copy is many events.
	watchQuiet = 500 * time.Millisecond
	// watchPoll syncs the folder this often whatever the events say, for
	// the changes a watch misses (network folders, a full event queue).
	watchPoll = 30 * time.Second
)

// SyncReport is what one sync of a watched folder changed.
type SyncReport struct {
	Added, Unchanged, Removed, Failed int
}

// Sync brings the index in line with a folder: files new or changed since
// they were indexed are (re)indexed, and documents under it whose file is
// gone are removed, as after a restart.
func (l *Library) Sync(ctx context.Context, dir string) (SyncReport, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return SyncReport{}, err
	}
	var rep SyncReport
	r, err := l.ix.Add(ctx, abs)
	if err != nil {
		return rep, err
	}
	rep.Added, rep.Unchanged, rep.Failed = r.Files, r.Unchanged, r.Skipped
	for _, d := range l.ix.Documents() {
		if !hasDirPrefix(d.Source, abs) {
			continue
		}
		if _, err := os.Stat(d.Source); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		before := l.passagesUnder(d.Source)
		if _, err := l.ix.Delete(d.Source); err != nil && !errors.Is(err, retrieval.ErrNotIndexed) {
			return rep, err
		}
		l.removed(before)
		rep.Removed++
	}
	if rep.Added+rep.Removed > 0 {
		l.kick()
	}
	return rep, nil
}

// Watch keeps the index in sync with a folder until ctx ends: a sync at
// once (what changed while the daemon was down), then one after each
// burst of changes, and one every watchPoll.
func (l *Library) Watch(ctx context.Context, dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	info, err := os.Stat(abs)
	if err != nil {
		return fmt.Errorf("--watch %s: %w", dir, err)
	}
	if !info.IsDir() {
		return fmt.Errorf("--watch %s: not a folder", dir)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("--watch %s: %w", dir, err)
	}
	defer w.Close()
	addTree := func() {
		filepath.WalkDir(abs, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if p != abs && strings.HasPrefix(d.Name(), ".") {
				return fs.SkipDir
			}
			if err := w.Add(p); err != nil {
				l.log.Warn("cannot watch a folder; it is synced every poll only", "folder", p, "err", err)
			}
			return nil
		})
	}
	sync := func() {
		addTree() // folders made since
		rep, err := l.Sync(ctx, abs)
		switch {
		case err != nil && ctx.Err() == nil:
			l.log.Error("syncing the watched folder failed", "folder", abs, "err", err)
		case rep.Added+rep.Removed+rep.Failed > 0:
			l.log.Info("synced the watched folder", "folder", abs, "added", rep.Added, "removed", rep.Removed, "failed", rep.Failed, "unchanged", rep.Unchanged)
		}
	}
	sync()
	poll := time.NewTicker(watchPoll)
	defer poll.Stop()
	quiet := time.NewTimer(time.Hour)
	quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if strings.HasPrefix(filepath.Base(ev.Name), ".") {
				continue // editors' swap files, the index's own temporaries
			}
			quiet.Reset(watchQuiet)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			l.log.Warn("folder watch", "folder", abs, "err", err)
			quiet.Reset(watchQuiet)
		case <-quiet.C:
			sync()
		case <-poll.C:
			sync()
		}
	}
}
