package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"go.etcd.io/raft/v3/raftpb"
)

// Membership of the metadata group (design/replication.md §6.7). raft's
// ConfState says who votes and who learns; Members adds what raft does
// not keep: each member's cluster address, and the ids removed for good
// (node ids are never reused). Both change only through committed conf
// changes, applied in log order on every node, and both go into every
// snapshot of the group, so a restart or a snapshot install recovers
// them without --peers naming the nodes that joined later.
//
// A conf change entry's context (this package's format, versioned):
//
//	context := 'C' u8 | 1 u8 | node u64 | epoch u64 | seq u64 | addrLen u16 | addr
//
// naming the proposal's origin (as a command entry's, metaEntryVersionOrigin)
// and, for a join, the new node's address. The group's snapshot image:
//
//	image := "WRNMETA\x01" | membersLen u32 | members | the state machine's snapshot
//	members := n u32 | n × (id u64 | addrLen u16 | addr) | r u32 | r × id u64
//
// An image without the magic is a state machine snapshot alone (written
// before membership was built): its members are MetaConfig's.

// Members is the metadata group's membership beyond raft's ConfState.
type Members struct {
	Addrs   map[uint64]string // every member, voter or learner: its cluster address
	Removed []uint64          // ids removed from the group, ascending
}

// Clone is a deep copy.
func (m Members) Clone() Members {
	return Members{Addrs: maps.Clone(m.Addrs), Removed: slices.Clone(m.Removed)}
}

// IDs is every member's id, ascending.
func (m Members) IDs() []uint64 { return slices.Sorted(maps.Keys(m.Addrs)) }

// MemberOp is what a membership change does.
type MemberOp byte

const (
	// MemberJoin adds a node as a learner of the metadata group; the
	// leader promotes it to voter once it has caught up (up to
	// MaxMetaVoters voters).
	MemberJoin MemberOp = 1
	// MemberPromote makes a learner a voter (the leader does it).
	MemberPromote MemberOp = 2
	// MemberRemove removes a node for good.
	MemberRemove MemberOp = 3
)

// MaxMetaVoters: nodes joining past this many voters stay learners of the
// metadata group (design §6.7; they still hold queues).
const MaxMetaVoters = 5

// MemberChange is a membership change to propose.
type MemberChange struct {
	Op   MemberOp
	Node uint64
	Addr string // MemberJoin: the node's cluster address, HOST:PORT
}

// Errors of membership changes (wrapped with the details).
var (
	ErrMemberExists  = errors.New("already a member")
	ErrMemberUnknown = errors.New("not a member")
	ErrMemberRefused = errors.New("membership change refused")
	// ErrNotMetaLeader: a membership change or leadership transfer asked
	// of a node that does not lead the metadata group (the caller
	// forwards it to the leader).
	ErrNotMetaLeader = errors.New("replication: this node does not lead the metadata group")
	// ErrChangePending: raft takes one configuration change at a time.
	ErrChangePending = errors.New("replication: another membership change is in progress; retry once it is applied")
	// ErrRemoved: this node was removed from the cluster.
	ErrRemoved = errors.New("replication: this node was removed from the cluster")
)

// checkChange says whether c may be applied to the membership m with
// raft configuration cs (deterministic: every node decides the same at
// apply).
func checkChange(m Members, cs raftpb.ConfState, c MemberChange) error {
	voter, learner := slices.Contains(cs.Voters, c.Node), slices.Contains(cs.Learners, c.Node)
	switch c.Op {
	case MemberJoin:
		if c.Node == 0 {
			return fmt.Errorf("%w: node ids are numbers from 1", ErrMemberRefused)
		}
		if slices.Contains(m.Removed, c.Node) {
			return fmt.Errorf("%w: node id %d was removed from the cluster, and node ids are never reused: give the new node another --node-id", ErrMemberRefused, c.Node)
		}
		if a, ok := m.Addrs[c.Node]; ok || voter || learner {
			if a == c.Addr {
				return fmt.Errorf("node %d is %w of the cluster, at %s", c.Node, ErrMemberExists, a)
			}
			return fmt.Errorf("%w: node id %d is taken by the member at %s: give the new node another --node-id", ErrMemberRefused, c.Node, a)
		}
		if c.Addr == "" {
			return fmt.Errorf("%w: node %d: no cluster address", ErrMemberRefused, c.Node)
		}
		for id, a := range m.Addrs {
			if a == c.Addr {
				return fmt.Errorf("%w: %s is node %d's cluster address", ErrMemberRefused, c.Addr, id)
			}
		}
	case MemberPromote:
		if !learner {
			return fmt.Errorf("%w: node %d is not a learner", ErrMemberRefused, c.Node)
		}
		if len(cs.Voters) >= MaxMetaVoters {
			return fmt.Errorf("%w: the metadata group has %d voters already", ErrMemberRefused, len(cs.Voters))
		}
	case MemberRemove:
		if !voter && !learner {
			if slices.Contains(m.Removed, c.Node) {
				return fmt.Errorf("node %d is %w: it was already removed", c.Node, ErrMemberUnknown)
			}
			return fmt.Errorf("node %d is %w of the cluster (members: %s)", c.Node, ErrMemberUnknown, idList(m.IDs()))
		}
		if voter && len(cs.Voters) == 1 {
			return fmt.Errorf("%w: node %d is the cluster's last voter; a cluster cannot remove it", ErrMemberRefused, c.Node)
		}
	default:
		return fmt.Errorf("%w: unknown operation %d", ErrMemberRefused, c.Op)
	}
	return nil
}

func idList(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(s, ", ")
}

// confChange is c as raft's conf change, its context naming the origin.
func confChange(c MemberChange, node, epoch, seq uint64) raftpb.ConfChange {
	cc := raftpb.ConfChange{NodeID: c.Node}
	switch c.Op {
	case MemberJoin:
		cc.Type = raftpb.ConfChangeAddLearnerNode
	case MemberPromote:
		cc.Type = raftpb.ConfChangeAddNode
	case MemberRemove:
		cc.Type = raftpb.ConfChangeRemoveNode
	}
	b := []byte{'C', 1}
	b = binary.LittleEndian.AppendUint64(b, node)
	b = binary.LittleEndian.AppendUint64(b, epoch)
	b = binary.LittleEndian.AppendUint64(b, seq)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Addr)))
	cc.Context = append(b, c.Addr...)
	return cc
}

// memberChangeOf decodes a committed conf change: the change and its origin.
func memberChangeOf(cc raftpb.ConfChange) (c MemberChange, node, epoch, seq uint64, err error) {
	b := cc.Context
	if len(b) < 28 || b[0] != 'C' || b[1] != 1 {
		return c, 0, 0, 0, errors.New("replication: a conf change this build did not write")
	}
	node, epoch, seq = binary.LittleEndian.Uint64(b[2:]), binary.LittleEndian.Uint64(b[10:]), binary.LittleEndian.Uint64(b[18:])
	n := int(binary.LittleEndian.Uint16(b[26:]))
	if len(b) != 28+n {
		return c, 0, 0, 0, errors.New("replication: a conf change's context has the wrong length")
	}
	c = MemberChange{Node: cc.NodeID, Addr: string(b[28:])}
	switch cc.Type {
	case raftpb.ConfChangeAddLearnerNode:
		c.Op = MemberJoin
	case raftpb.ConfChangeAddNode:
		c.Op = MemberPromote
	case raftpb.ConfChangeRemoveNode:
		c.Op = MemberRemove
	default:
		return c, 0, 0, 0, fmt.Errorf("replication: conf change type %v is not used by the metadata group", cc.Type)
	}
	return c, node, epoch, seq, nil
}

// applyMember changes m as c does (checked).
func applyMember(m *Members, c MemberChange) {
	switch c.Op {
	case MemberJoin:
		if m.Addrs == nil {
			m.Addrs = map[uint64]string{}
		}
		m.Addrs[c.Node] = c.Addr
	case MemberRemove:
		delete(m.Addrs, c.Node)
		if !slices.Contains(m.Removed, c.Node) {
			m.Removed = append(m.Removed, c.Node)
			slices.Sort(m.Removed)
		}
	}
}

var metaImageMagic = []byte("WRNMETA\x01")

// wrapMetaImage is the group's snapshot image: members, then the state
// machine's snapshot.
func wrapMetaImage(m Members, fsm []byte) []byte {
	b := append([]byte(nil), metaImageMagic...)
	b = append(b, 0, 0, 0, 0)
	start := len(b)
	ids := m.IDs()
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ids)))
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint64(b, id)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Addrs[id])))
		b = append(b, m.Addrs[id]...)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Removed)))
	for _, id := range m.Removed {
		b = binary.LittleEndian.AppendUint64(b, id)
	}
	binary.LittleEndian.PutUint32(b[start-4:], uint32(len(b)-start))
	return append(b, fsm...)
}

// splitMetaImage returns an image's members (ok false: an image written
// before membership, all state machine) and state machine snapshot.
func splitMetaImage(img []byte) (m Members, fsm []byte, ok bool, err error) {
	if !bytes.HasPrefix(img, metaImageMagic) {
		return m, img, false, nil
	}
	bad := errors.New("replication: the metadata snapshot's membership does not decode")
	b := img[len(metaImageMagic):]
	if len(b) < 4 || uint64(binary.LittleEndian.Uint32(b)) > uint64(len(b)-4) {
		return m, nil, false, bad
	}
	n := binary.LittleEndian.Uint32(b)
	mb, fsm := b[4:4+n], b[4+n:]
	if len(mb) < 4 {
		return m, nil, false, bad
	}
	cnt := binary.LittleEndian.Uint32(mb)
	mb = mb[4:]
	m.Addrs = map[uint64]string{}
	for range cnt {
		if len(mb) < 10 {
			return m, nil, false, bad
		}
		id, l := binary.LittleEndian.Uint64(mb), int(binary.LittleEndian.Uint16(mb[8:]))
		if len(mb) < 10+l {
			return m, nil, false, bad
		}
		m.Addrs[id] = string(mb[10 : 10+l])
		mb = mb[10+l:]
	}
	if len(mb) < 4 {
		return m, nil, false, bad
	}
	r := binary.LittleEndian.Uint32(mb)
	mb = mb[4:]
	if uint64(len(mb)) != 8*uint64(r) {
		return m, nil, false, bad
	}
	for i := range r {
		m.Removed = append(m.Removed, binary.LittleEndian.Uint64(mb[8*i:]))
	}
	return m, fsm, true, nil
}

// CheckChange says whether c would be refused as the membership stands
// on this node now (the leader checks again when it proposes, and every
// node when it applies).
func (g *MetaGroup) CheckChange(c MemberChange) error {
	m, cs := g.Members()
	return checkChange(m, cs, c)
}
