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

// TestClusterJoinLongAddress: a join's cluster address is in the conf
// change's context with a 16-bit length; the admin API's POST
// /api/cluster/join took an address of any length and form (only an
// empty one was refused), so one of 70,000 bytes was proposed with its
// length wrapped, refused at apply on every node (logged there, 'a conf
// change's context has the wrong length'), and the request answered only
// when it timed out, 15 s later, with 'not applied in time (it may still
// be)'. An address that is no HOST:PORT, or longer than one can be, is
// refused before the proposal (invalid_argument), on a follower as on
// the leader; the cluster takes the next change.
func TestClusterJoinLongAddress(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.leader()
	follower := c.nodes[lead.id%3]
	ctx := context.Background()
	for _, addr := range []string{strings.Repeat("h", 70000) + ":5682", strings.Repeat("h", 300) + ":5682", "no-port"} {
		for _, nd := range []*clusterNode{lead, follower} {
			err := nd.b.Load().JoinNode(ctx, 9, addr)
			var we *wire.Error
			if !errors.As(err, &we) || we.Code != wire.InvalidArgument {
				t.Fatalf("node %d: a join at an address of %d bytes (%.12q): %v, want invalid_argument", nd.id, len(addr), addr, err)
			}
		}
	}
	c.declareSeen(wire.QueueDeclare{Name: "after", Durable: true})
	c.stop(follower)
	c.start(follower, nil)
	c.sees(follower, "queue after durable=true")
}

// TestClusterRefusesOversizeCommand: a queue declare's arguments are
// proposed before any machine checks them, so a native client with
// max_frame raised past 32 MiB could propose a declare of 33 MiB of
// arguments: an entry the log refuses (segment.MaxEntry), and every node
// stopped at the write. A command over maxMetaCommand is refused before
// the proposal; the cluster takes the next change.
func TestClusterRefusesOversizeCommand(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.leader()
	args := wire.Table{{Key: "x-big", Value: wire.Bytes(make([]byte, 33<<20))}}
	_, err := lead.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "big", Durable: true, Args: args}, 0, "")
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.InvalidArgument || !strings.Contains(we.Reason, "larger than") {
		t.Fatalf("a declare with 33 MiB of arguments: %v, want invalid_argument", err)
	}
	c.declareSeen(wire.QueueDeclare{Name: "after", Durable: true})
}
