package admin

import (
	"net/http"
	"strconv"
	"time"

	"github.com/warren-mq/warren/wire"
)

// Whole lists — GET /api/exchanges, /api/bindings, /api/connections,
// /api/channels and /api/queues — are built in memory whole: a copy of
// that part of the broker's state, then its JSON (at max_queues one
// answer is hundreds of MB; a page of queues is small, but sorting it
// out copies every queue's counts). At most maxWholeLists are
// built at once; a request past them waits for one to finish, up to
// wholeListWait, then gets 503 naming the bound. The HTTP connection cap
// bounds how many wait; a waiting request holds its connection and a
// goroutine, nothing of the answer.
const (
	maxWholeLists = 2
	wholeListWait = 10 * time.Second
)

// wholeList wraps the handler of a whole list: h runs holding one of
// the maxWholeLists slots.
func (a *API) wholeList(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.takeWholeList(w, r) {
			return
		}
		defer func() { <-a.lists }()
		h(w, r)
	}
}

// takeWholeList takes a slot, waiting up to a.listWait; false: it wrote
// the refusal (503), or the client went away.
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
		writeErr(w, &wire.Error{Code: wire.ResourceLimit, Reason: "busy: at most " + strconv.Itoa(maxWholeLists) +
			" whole lists are built at once and none finished within " + a.listWait.String() +
			"; retry"})
		return false
	}
}
