package client

// SetPoisonReleased switches the warrendebug poisoning of released
// ConsumeBatch bodies on or off and returns a func that restores it.
func SetPoisonReleased(on bool) (restore func()) {
	old := poisonReleased
	poisonReleased = on
	return func() { poisonReleased = old }
}
