//go:build !race

package abuse

const raceEnabled = false
