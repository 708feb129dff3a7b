package broker

import (
	"strings"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// Permissions are per user per vhost in Meta: set by a command, checked
// (their regexps compile) when set, bounded, dropped with their user, kept
// in snapshots.
func TestMetaPermissions(t *testing.T) {
	m := NewMetaWithLimits(1, MetaLimits{MaxPermissions: 1})
	m.Apply(&MetaCommand{Op: MetaPutUser, Admin: true, Account: MetaUser{Name: "a", PasswordHash: "h"}})
	m.Apply(&MetaCommand{Op: MetaPutUser, Admin: true, Account: MetaUser{Name: "b", PasswordHash: "h"}})
	set := func(p MetaPermission) MetaResult {
		r, _ := m.Apply(&MetaCommand{Op: MetaSetPermission, Admin: true, Permission: p})
		return r
	}
	if r := set(MetaPermission{Vhost: "/", User: "a", Configure: ".*", Write: "^x", Read: ""}); r.Err() != nil {
		t.Fatal(r.Err())
	}
	if r := set(MetaPermission{Vhost: "/", User: "b", Configure: "(", Write: "", Read: ""}); r.Code != wire.InvalidArgument || !strings.Contains(r.Reason, "configure") {
		t.Fatalf("bad regexp: %+v", r)
	}
	if r := set(MetaPermission{Vhost: "/", User: "zed", Configure: ".*"}); r.Code != wire.NotFound {
		t.Fatalf("unknown user: %+v", r)
	}
	if r := set(MetaPermission{Vhost: "/", User: "b", Configure: ".*"}); r.Code != wire.LimitReached {
		t.Fatalf("past MaxPermissions: %+v", r)
	}
	n := NewMeta(1)
	if err := n.Restore(m.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if ps := n.Permissions(); len(ps) != 1 || ps[0].Write != "^x" {
		t.Fatalf("restored %+v", ps)
	}
	m.Apply(&MetaCommand{Op: MetaDeleteUser, Admin: true, Account: MetaUser{Name: "a"}})
	if len(m.Permissions()) != 0 {
		t.Fatal("a deleted user's permissions stay")
	}
	c := MetaCommand{Op: MetaSetPermission, Admin: true, Permission: MetaPermission{Vhost: "/", User: "a", Configure: "c", Write: "w", Read: "r"}}
	got, err := DecodeMetaCommand(AppendMetaCommand(nil, &c))
	if err != nil || got.Permission != c.Permission {
		t.Fatalf("codec: %+v %v", got, err)
	}
}
