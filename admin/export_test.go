package admin

import "time"

// SampleAt takes a rate sample as of now (tests pass a fake clock).
func (a *API) SampleAt(now time.Time) { a.sampleAt(now) }
