//go:build race

package aggregator

// raceDetector is on: tests whose cost is scanning large distributions run
// fewer steps, since the detector multiplies that cost tenfold.
const raceDetector = true
