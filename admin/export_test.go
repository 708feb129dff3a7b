package admin

import "time"

// SampleAt takes a rate sample as of now (tests pass a fake clock).
func (a *API) SampleAt(now time.Time) { a.sampleAt(now) }

// MaxWholeLists is maxWholeLists (lists.go).
const MaxWholeLists = maxWholeLists

// HoldWholeLists takes n slots of the whole lists' bound, as n lists
// being built would; ReleaseWholeList frees one.
func (a *API) HoldWholeLists(n int) {
	for range n {
		a.lists <- struct{}{}
	}
}

func (a *API) ReleaseWholeList() { <-a.lists }

// WholeListsHeld is how many slots are taken.
func (a *API) WholeListsHeld() int { return len(a.lists) }

// SetListWait sets how long a list request waits for a slot.
func (a *API) SetListWait(d time.Duration) { a.listWait = d }
