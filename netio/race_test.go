//go:build race

package netio

// raceEnabled: timing measurements mean nothing under the race detector.
const raceEnabled = true
