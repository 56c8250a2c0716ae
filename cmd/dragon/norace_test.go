//go:build !race

package main

const raceShareMB = 0
