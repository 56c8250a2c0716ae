package kvcache

import "time"

// DiskRetry is how long the disk tier stays off after a failed write.
const DiskRetry = diskRetry

// SetClock makes c read the time from now.
func SetClock(c *Cache, now func() time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
}

// BeforeRename makes c's disk writes call f between writing a file and
// renaming it into place.
func BeforeRename(c *Cache, f func()) { c.disk.beforeRename = f }

// Unmapped says whether the memory h's state shared has gone back to the
// system (false for a hit that shared none).
func Unmapped(h *Hit) bool {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.blk != nil && h.blk.b == nil
}

// HitBlock keeps a reference to h's state's memory past h.Done, for
// Unmapped to look at after it.
func HitBlock(h Hit) *Hit { return &Hit{c: h.c, blk: h.blk} }
