//go:build warrendebug

package client

// poisonReleased: overwrite ConsumeBatch bodies once their handler
// returns, so a body kept past its handler reads 0xDB.
var poisonReleased = true
