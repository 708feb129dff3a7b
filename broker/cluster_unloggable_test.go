package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestClusterRefusesUnloggable: in a cluster a metadata command is
// proposed, and in every node's log, before any node's machine can refuse
// it, so what the metadata decoder refuses must be refused before the
// proposal. A user of 17 tags (the admin API passes any number; the
// decoder reads at most 16) and a vhost with a negative limit were
// proposed: every node's metadata group stopped at the entry ("metadata
// encoding: user ... with 17 tags"), and no node could start again from
// its log. They are refused as on one node (invalid_argument), the
// cluster takes the next change, and a node restarts from its log.
func TestClusterRefusesUnloggable(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.leader()
	follower := c.nodes[lead.id%3]
	ctx := context.Background()
	const hash = "$2a$04$abcdefghijklmnopqrstuuxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
	var tags []string
	for i := range maxUserTags + 1 {
		tags = append(tags, fmt.Sprint("t", i))
	}
	invalid := func(what string, err error, reason string) {
		t.Helper()
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.InvalidArgument || !strings.Contains(we.Reason, reason) {
			t.Fatalf("%s: %v, want invalid_argument %q", what, err, reason)
		}
	}
	for _, nd := range []*clusterNode{follower, lead} {
		b := nd.b.Load()
		invalid("a user of 17 tags", b.PutUser(ctx, MetaUser{Name: "u", PasswordHash: hash, Tags: tags}), "at most 16 tags")
		invalid("a vhost with max_queues -1", b.PutVhost(ctx, MetaVhost{Name: "v", MaxQueues: -1}), "0 (none) or more")
		invalid("a vhost with max_connections -1", b.PutVhost(ctx, MetaVhost{Name: "v", MaxConnections: -1}), "0 (none) or more")
	}
	// What a command builder let through is refused before the proposal
	// all the same (clusterChange decodes what it would propose).
	tb := lead.b.Load().topo
	r := tb.clusterChange(tb.cl.Load(), &MetaCommand{Op: MetaPutUser, Admin: true, Account: MetaUser{Name: "u", PasswordHash: hash, Tags: tags}})
	invalid("a user of 17 tags proposed as it is", r.Err(), "cannot be stored in the metadata log")

	if err := follower.b.Load().PutUser(ctx, MetaUser{Name: "u", PasswordHash: hash, Tags: tags[:maxUserTags]}); err != nil {
		t.Fatal(err)
	}
	c.declareSeen(wire.QueueDeclare{Name: "after", Durable: true})
	c.stop(follower)
	c.start(follower, nil)
	c.sees(follower, "queue after durable=true")
	if u, ok := follower.b.Load().User("u"); !ok || len(u.Tags) != maxUserTags {
		t.Fatalf("after its restart node %d has user u %v (%v), want it with %d tags", follower.id, u, ok, maxUserTags)
	}
}
