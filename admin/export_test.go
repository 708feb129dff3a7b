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

// HoldListBytes takes n bytes of the built answers' budget, as answers
// being written would; GiveListBytes gives them back.
func (a *API) HoldListBytes(n int) { a.listBytes.take(n, 0, nil) }

func (a *API) GiveListBytes(n int) { a.listBytes.give(n) }

// ListBytesHeld is what the budget holds.
func (a *API) ListBytesHeld() int { return a.listBytes.heldBytes() }

// MaxListBytes is maxListBytes (lists.go).
const MaxListBytes = maxListBytes
