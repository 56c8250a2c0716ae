//go:build dragon_leak_sources

package session

// The dragon_leak_sources build is the privacy test's control: its device
// sends its own sources to the cloud (leakSources), which the test must
// then find on the link.
func init() { leakSources = true }
