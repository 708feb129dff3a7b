//go:build !warrendebug

package client

// poisonReleased: overwrite ConsumeBatch bodies once their handler
// returns (on with -tags warrendebug; tests switch it on themselves).
var poisonReleased = false
