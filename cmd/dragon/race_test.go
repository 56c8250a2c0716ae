//go:build race

package main

// raceShareMB is what the race detector adds to a daemon's own memory
// (its shadow of the Go heap): SmolLM2's device under -race peaked at 196
// MiB, 141 MiB without.
const raceShareMB = 55
