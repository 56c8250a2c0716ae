//go:build race

package rerank

// raceDetector is on: the float64 reference checks fewer passages, since
// the detector multiplies its cost tenfold.
const raceDetector = true
