//go:build race

package queue

// raceEnabled scales down the tests that route many keys under -race.
const raceEnabled = true
