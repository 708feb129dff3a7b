package admin

import (
	"testing"

	"github.com/warren-mq/warren/broker"
)

// sameSource: rates are the difference of two samples only when both
// counted this node's own copy of the queue; a replica that moved in or
// opened (none → follower), or counts fetched from the leader (none),
// are a baseline, not an interval's work (a review saw a node's rates
// count a moved-in replica's whole history as one interval's publishes).
func TestSameSource(t *testing.T) {
	for _, c := range []struct {
		p, q string
		want bool
	}{
		{"", "", true},                 // a queue every node keeps its own copy of
		{"follower", "leader", true},   // the same replica, its raft role changed
		{"leader", "follower", true},   //
		{"follower", "follower", true}, //
		{"none", "follower", false},    // moved in
		{"none", "none", false},        // counts fetched from the leader
		{"failed", "follower", false},  // rebuilt
		{"follower", "none", false},    // moved away
		{"", "follower", false},        // (a name reused by another kind of queue)
	} {
		if got := sameSource(broker.QueueStats{RaftRole: c.p}, broker.QueueStats{RaftRole: c.q}); got != c.want {
			t.Errorf("%q then %q: %v, want %v", c.p, c.q, got, c.want)
		}
	}
}
