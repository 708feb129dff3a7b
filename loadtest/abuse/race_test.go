//go:build race

package abuse

// raceEnabled: the scaled-down suite is skipped under the race detector,
// where the broker child is not instrumented anyway and the extra load on
// the test process would measure the detector, not the broker.
const raceEnabled = true
