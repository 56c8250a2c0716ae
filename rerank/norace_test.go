//go:build !race

package rerank

const raceDetector = false
