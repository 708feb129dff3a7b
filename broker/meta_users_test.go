package broker

import (
	"slices"
	"strings"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// Users live in the metadata state machine: created, replaced, deleted by
// commands carrying the (already salted and hashed) password, kept in
// snapshots, bounded by MaxUsers.
func TestMetaUsers(t *testing.T) {
	m := NewMetaWithLimits(2, MetaLimits{MaxUsers: 2})
	put := func(name, hash string, ifAbsent bool, tags ...string) MetaResult {
		r, _ := m.Apply(&MetaCommand{Op: MetaPutUser, Admin: true, Account: MetaUser{Name: name, PasswordHash: hash, Tags: tags}, IfAbsent: ifAbsent})
		return r
	}
	if r := put("alice", "$2a$10$h1", false, "administrator"); r.Err() != nil {
		t.Fatal(r.Err())
	}
	if r := put("alice", "$2a$10$other", true); r.Err() != nil {
		t.Fatal(r.Err())
	}
	if u, ok := m.User("alice"); !ok || u.PasswordHash != "$2a$10$h1" || !slices.Equal(u.Tags, []string{"administrator"}) {
		t.Fatalf("IfAbsent replaced an existing user: %+v", u)
	}
	if r := put("alice", "$2a$10$h2", false); r.Err() != nil {
		t.Fatal(r.Err())
	}
	if u, _ := m.User("alice"); u.PasswordHash != "$2a$10$h2" || len(u.Tags) != 0 {
		t.Fatalf("put did not replace: %+v", u)
	}
	if r := put("", "$2a$10$h", false); r.Code != wire.InvalidArgument {
		t.Fatalf("empty name: %+v", r)
	}
	if r := put("bob", "", false); r.Code != wire.InvalidArgument {
		t.Fatalf("empty hash: %+v", r)
	}
	if r := put("bob", "$2a$10$b", false); r.Err() != nil {
		t.Fatal(r.Err())
	}
	if r := put("carol", "$2a$10$c", false); r.Code != wire.LimitReached || !strings.Contains(r.Reason, "max_users") {
		t.Fatalf("third user past MaxUsers 2: %+v", r)
	}
	if r := put("bob", "$2a$10$b2", false); r.Err() != nil {
		t.Fatalf("replacing at the limit: %v", r.Err())
	}

	// The snapshot keeps them; the hash, never the password.
	snap := m.Snapshot()
	n := NewMeta(2)
	if err := n.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if got := n.Users(); len(got) != 2 || got[0].Name != "alice" || got[1].PasswordHash != "$2a$10$b2" {
		t.Fatalf("restored users %+v", got)
	}

	r, effs := m.Apply(&MetaCommand{Op: MetaDeleteUser, Admin: true, Account: MetaUser{Name: "bob"}})
	if r.Err() != nil || len(effs) != 1 || effs[0].Kind != EffUserRemoved || effs[0].Name != "bob" {
		t.Fatalf("delete: %+v %+v", r, effs)
	}
	if r, _ := m.Apply(&MetaCommand{Op: MetaDeleteUser, Admin: true, Account: MetaUser{Name: "bob"}}); r.Code != wire.NotFound {
		t.Fatalf("delete of an absent user: %+v", r)
	}
	// A restore over a state with bob tells the sink bob is gone.
	effs = diffMeta(n, m)
	if !slices.ContainsFunc(effs, func(e MetaEffect) bool { return e.Kind == EffUserRemoved && e.Name == "bob" }) {
		t.Fatalf("diff lacks bob's removal: %+v", effs)
	}
}

// A version-1 snapshot (before users) still restores, with no users.
func TestMetaSnapshotV1StillReads(t *testing.T) {
	m := NewMeta(1)
	if r, _ := m.Apply(&MetaCommand{Op: MetaDeclareQueue, Queue: wire.QueueDeclare{Name: "q"}}); r.Err() != nil {
		t.Fatal(r.Err())
	}
	snap := m.snapshotAt(4)
	// A version 4 snapshot of a state without users or permissions is the v1
	// one with two zero counts and the vhosts ("/" alone: a count and 21
	// bytes): cut them, and mark it v1.
	v1 := append([]byte{1}, snap[1:len(snap)-8-4-21]...)
	n := NewMeta(1)
	if err := n.Restore(v1); err != nil {
		t.Fatalf("v1 snapshot: %v", err)
	}
	if !n.HasQueue("q") || len(n.Users()) != 0 {
		t.Fatal("v1 snapshot restored wrong")
	}
	if snap = m.Snapshot(); snap[0] != MetaSnapshotVersion || MetaSnapshotVersion < 2 {
		t.Fatalf("snapshot version %d", snap[0])
	}
}

func TestMetaUserCommandCodec(t *testing.T) {
	for _, c := range []MetaCommand{
		{Op: MetaPutUser, NowMs: 5, Admin: true, Account: MetaUser{Name: "a", PasswordHash: "$2a$10$x", Tags: []string{"administrator", "monitoring"}}, IfAbsent: true},
		{Op: MetaDeleteUser, User: "root", Account: MetaUser{Name: "a"}},
	} {
		b := AppendMetaCommand(nil, &c)
		got, err := DecodeMetaCommand(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.Op != c.Op || got.Account.Name != c.Account.Name || got.Account.PasswordHash != c.Account.PasswordHash ||
			!slices.Equal(got.Account.Tags, c.Account.Tags) || got.IfAbsent != c.IfAbsent {
			t.Fatalf("round trip %+v -> %+v", c, got)
		}
		for i := range b {
			_, _ = DecodeMetaCommand(b[:i]) // never panics
		}
	}
}
