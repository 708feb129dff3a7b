package admin

import (
	"bytes"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/warren-mq/warren/wire"
)

// Whole lists — GET /api/exchanges, /api/bindings, /api/connections,
// /api/channels and /api/queues — are built in memory whole: a copy of
// that part of the broker's state, then its JSON (at max_queues one
// answer is hundreds of MB; a page of queues is small, but sorting it
// out copies every queue's counts). Two bounds:
//
//   - at most maxWholeLists are built at once;
//   - the answers built and not yet written to their clients hold at most
//     maxListBytes together (one larger than that is let through alone).
//
// The answer is built into a buffer under a build slot, its bytes are
// taken from the budget before the slot is given back, and given back
// once written: a client that reads slowly holds its answer's bytes (up
// to http_timeout_ms), not a build slot. A request that cannot have a
// slot or its bytes within wholeListWait gets 503 naming the bound. The
// HTTP connection cap bounds how many wait; a waiting request holds its
// connection and a goroutine (and, for the bytes, its built answer while
// it holds a slot).
const (
	maxWholeLists = 2
	maxListBytes  = 256 << 20
	wholeListWait = 10 * time.Second
)

// listBudget is the bytes of built answers not yet written.
type listBudget struct {
	mu      sync.Mutex
	used    int
	changed chan struct{} // closed and replaced when bytes are given back
}

// take waits until n bytes fit (or nothing is held), up to wait; false
// if they did not, or done closed.
func (lb *listBudget) take(n int, wait time.Duration, done <-chan struct{}) bool {
	var timer <-chan time.Time
	for {
		lb.mu.Lock()
		if lb.used == 0 || lb.used+n <= maxListBytes {
			lb.used += n
			lb.mu.Unlock()
			return true
		}
		if lb.changed == nil {
			lb.changed = make(chan struct{})
		}
		ch := lb.changed
		lb.mu.Unlock()
		if timer == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-ch:
		case <-timer:
			return false
		case <-done:
			return false
		}
	}
}

func (lb *listBudget) give(n int) {
	lb.mu.Lock()
	lb.used -= n
	if lb.changed != nil {
		close(lb.changed)
		lb.changed = nil
	}
	lb.mu.Unlock()
}

// heldBytes is what the budget holds (tests).
func (lb *listBudget) heldBytes() int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.used
}

// bufferedResponse is an answer built in memory before it is written.
type bufferedResponse struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header         { return b.header }
func (b *bufferedResponse) WriteHeader(code int)        { b.code = code }
func (b *bufferedResponse) Write(p []byte) (int, error) { return b.body.Write(p) }

// wholeList wraps the handler of a whole list with the bounds above.
func (a *API) wholeList(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.takeWholeList(w, r) {
			return
		}
		built := &bufferedResponse{header: http.Header{}, code: http.StatusOK}
		fits := func() bool {
			defer func() { <-a.lists }() // even if h panics
			h(built, r)
			return a.listBytes.take(built.body.Len(), a.listWait, r.Context().Done())
		}()
		if !fits {
			a.busy(w, "the answers built and not yet read by their clients hold "+strconv.Itoa(maxListBytes>>20)+" MiB")
			return
		}
		defer a.listBytes.give(built.body.Len())
		for k, v := range built.header {
			w.Header()[k] = v
		}
		w.WriteHeader(built.code)
		_, _ = w.Write(built.body.Bytes())
	}
}

// takeWholeList takes a build slot, waiting up to a.listWait; false: it
// wrote the refusal (503), or the client went away.
func (a *API) takeWholeList(w http.ResponseWriter, r *http.Request) bool {
	select {
	case a.lists <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(a.listWait)
	defer t.Stop()
	select {
	case a.lists <- struct{}{}:
		return true
	case <-r.Context().Done():
		return false
	case <-t.C:
		a.busy(w, "at most "+strconv.Itoa(maxWholeLists)+" whole lists are built at once")
		return false
	}
}

func (a *API) busy(w http.ResponseWriter, bound string) {
	writeErr(w, &wire.Error{Code: wire.ResourceLimit, Reason: "busy: " + bound + " and none finished within " +
		a.listWait.String() + "; retry"})
}
