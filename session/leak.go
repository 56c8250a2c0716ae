package session

// leakSources makes the owner send its own sources to the peer once an
// answer is over, and the device its own retrieval filter in the Begin:
// exactly what must never happen, so that the privacy tests can show they
// would catch it. No daemon sets it; session's tests
// do, and so does the dragon_leak_sources build (leak_on.go), the control
// of the end-to-end privacy test.
var leakSources bool

// LeaksSources reports whether this build sends the device's own sources
// to the cloud on purpose (the dragon_leak_sources test build).
func LeaksSources() bool { return leakSources }
