package replication

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestMetaImage: the snapshot image keeps the members and the state
// machine's bytes; an image without the magic (written before
// membership) is all state machine; a damaged one is refused.
func TestMetaImage(t *testing.T) {
	m := Members{Addrs: map[uint64]string{1: "a:1", 2: "b:2", 4: "d:4"}, Removed: []uint64{3}}
	img := wrapMetaImage(m, []byte{5, 1, 2, 3})
	got, fsm, ok, err := splitMetaImage(img)
	if err != nil || !ok || !maps.Equal(got.Addrs, m.Addrs) || !slices.Equal(got.Removed, m.Removed) || string(fsm) != "\x05\x01\x02\x03" {
		t.Fatalf("round trip: %+v %v %v %v", got, fsm, ok, err)
	}
	if _, fsm, ok, err := splitMetaImage([]byte{5, 9}); ok || err != nil || len(fsm) != 2 {
		t.Fatalf("an old image: %v %v %v", fsm, ok, err)
	}
	for cut := len(metaImageMagic); cut < len(img)-4; cut++ {
		if _, _, _, err := splitMetaImage(img[:cut]); err == nil {
			t.Fatalf("an image cut at %d decoded", cut)
		}
	}
}

// TestCheckChange: the membership checks every node makes at apply.
func TestCheckChange(t *testing.T) {
	m := Members{Addrs: map[uint64]string{1: "a:1", 2: "b:2", 3: "c:3"}, Removed: []uint64{7}}
	cs := raftpb.ConfState{Voters: []uint64{1, 2}, Learners: []uint64{3}}
	for _, c := range []struct {
		ch   MemberChange
		is   error
		text string
	}{
		{MemberChange{Op: MemberJoin, Node: 4, Addr: "d:4"}, nil, ""},
		{MemberChange{Op: MemberJoin, Node: 2, Addr: "b:2"}, ErrMemberExists, "already a member"},
		{MemberChange{Op: MemberJoin, Node: 2, Addr: "x:9"}, ErrMemberRefused, "taken by the member at b:2"},
		{MemberChange{Op: MemberJoin, Node: 7, Addr: "g:7"}, ErrMemberRefused, "never reused"},
		{MemberChange{Op: MemberJoin, Node: 5, Addr: "a:1"}, ErrMemberRefused, "node 1's cluster address"},
		{MemberChange{Op: MemberJoin, Node: 0, Addr: "z:1"}, ErrMemberRefused, "numbers from 1"},
		{MemberChange{Op: MemberPromote, Node: 3}, nil, ""},
		{MemberChange{Op: MemberPromote, Node: 2}, ErrMemberRefused, "not a learner"},
		{MemberChange{Op: MemberRemove, Node: 3}, nil, ""},
		{MemberChange{Op: MemberRemove, Node: 9}, ErrMemberUnknown, "members: 1, 2, 3"},
		{MemberChange{Op: MemberRemove, Node: 7}, ErrMemberUnknown, "already removed"},
	} {
		err := checkChange(m, cs, c.ch)
		if c.is == nil {
			if err != nil {
				t.Errorf("%+v: %v", c.ch, err)
			}
			continue
		}
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%+v: %v, want %v with %q", c.ch, err, c.is, c.text)
		}
	}
	one := raftpb.ConfState{Voters: []uint64{1}, Learners: []uint64{3}}
	if err := checkChange(m, one, MemberChange{Op: MemberRemove, Node: 1}); !errors.Is(err, ErrMemberRefused) || !strings.Contains(err.Error(), "last voter") {
		t.Errorf("removing the last voter: %v", err)
	}
	five := raftpb.ConfState{Voters: []uint64{1, 2, 4, 5, 6}, Learners: []uint64{3}}
	if err := checkChange(m, five, MemberChange{Op: MemberPromote, Node: 3}); !errors.Is(err, ErrMemberRefused) {
		t.Errorf("a sixth voter: %v", err)
	}
	// The conf change's context carries the change and its origin.
	cc := confChange(MemberChange{Op: MemberJoin, Node: 4, Addr: "d:4"}, 2, 99, 5)
	c, node, epoch, seq, err := memberChangeOf(cc)
	if err != nil || c != (MemberChange{Op: MemberJoin, Node: 4, Addr: "d:4"}) || node != 2 || epoch != 99 || seq != 5 {
		t.Fatalf("context round trip: %+v %d %d %d %v", c, node, epoch, seq, err)
	}
}
