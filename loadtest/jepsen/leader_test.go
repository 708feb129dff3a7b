package jepsen

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestLeaderURL: the kill-leader nemesis's target is the node the admin API names as the
// queue's leader, whichever node answers; a node that cannot answer is
// skipped; no leader named anywhere is an error.
func TestLeaderURL(t *testing.T) {
	var leader string // the JSON each node answers
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "guest" || p != "guest" || r.URL.Path != "/api/queues/jepsen-0" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		w.Write([]byte(leader))
	}))
	defer api.Close()
	addr := strings.TrimPrefix(api.URL, "http://")
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	downAddr := strings.TrimPrefix(down.URL, "http://")
	cl := &cluster{nodes: []*node{
		{id: 1, listen: "127.0.0.1:1001", http: addr},
		{id: 2, listen: "127.0.0.1:1002", http: downAddr},
		{id: 3, listen: "127.0.0.1:1003", http: addr},
	}}
	ctx := context.Background()
	leader = `{"name":"jepsen-0","leader":2}`
	for range 10 { // the nodes are asked in a random order
		u, err := cl.leader(ctx, "jepsen-0")
		if err != nil || u != "warren://guest:guest@127.0.0.1:1002" {
			t.Fatalf("leader 2: %q, %v", u, err)
		}
	}
	leader = `{"name":"jepsen-0"}` // none known
	if u, err := cl.leader(ctx, "jepsen-0"); err == nil {
		t.Fatalf("no leader known: %q", u)
	}
	leader = `{"name":"jepsen-0","leader":7}` // not one of ours
	if u, err := cl.leader(ctx, "jepsen-0"); err == nil {
		t.Fatalf("unknown leader: %q", u)
	}
}
