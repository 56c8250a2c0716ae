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
