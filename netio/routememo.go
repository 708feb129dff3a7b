package netio

import (
	"bytes"

	"github.com/warren-mq/warren/queue"
)

// routeMemo remembers the routes of the last few routing keys of one
// PUBLISH batch, so that a batch whose messages take turns among a few keys
// (a producer spreading its messages over queues) routes each key once. A
// batch is routed against one view, and a message without headers is
// routed by its exchange (the batch's) and key alone; one with headers is
// not memoized. The keys are views of the batch's arena: forget drops them
// when the batch is done, so they do not keep it alive.
type routeMemo struct {
	n, next int
	keys    [routeMemoSize][]byte
	refs    [routeMemoSize][]queue.QueueRef
}

const routeMemoSize = 4

// route is Route's result for a message without headers.
func (r *routeMemo) route(t *queue.Table, exchange string, key []byte) []queue.QueueRef {
	for i := range r.n {
		if bytes.Equal(r.keys[i], key) {
			return r.refs[i]
		}
	}
	i := r.next
	r.refs[i], _ = t.Route(r.refs[i][:0], exchange, key, nil)
	r.keys[i] = key
	r.next = (i + 1) % routeMemoSize
	r.n = max(r.n, i+1)
	return r.refs[i]
}

func (r *routeMemo) forget() {
	clear(r.keys[:r.n])
	r.n, r.next = 0, 0
}
