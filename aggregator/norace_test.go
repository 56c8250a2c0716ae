//go:build !race

package aggregator

const raceDetector = false
