package queue

import "testing"

// A virtual host's default exchange ("v" VhostSep) routes to the queue
// named "v" VhostSep key, without allocating; the plain default exchange
// to the queue named key; neither reaches the other's.
func TestRouteVhostDefaultExchange(t *testing.T) {
	r := NewRoutes()
	r.AddQueue("q", 1)
	r.AddQueue("v\x1fq", 2)
	tab := r.Table()
	dst := make([]QueueRef, 0, 4)
	for _, c := range []struct {
		ex, key string
		want    []QueueRef
	}{{"", "q", []QueueRef{1}}, {"v\x1f", "q", []QueueRef{2}}, {"w\x1f", "q", nil}, {"", "v\x1fq", nil}} {
		got, ok := tab.Route(dst[:0], c.ex, []byte(c.key), nil)
		if !ok || len(got) != len(c.want) || (len(got) == 1 && got[0] != c.want[0]) {
			t.Errorf("Route(%q, %q) = %v %v, want %v", c.ex, c.key, got, ok, c.want)
		}
		if !tab.HasExchange(c.ex) {
			t.Errorf("HasExchange(%q) is false", c.ex)
		}
	}
	key := []byte("q")
	if n := testing.AllocsPerRun(1000, func() { dst, _ = tab.Route(dst[:0], "v\x1f", key, nil) }); n != 0 {
		t.Fatalf("a vhost default-exchange route allocates %v times", n)
	}
}
