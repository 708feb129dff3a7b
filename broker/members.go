package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/replication/cluster"
	"github.com/warren-mq/warren/wire"
)

// Membership of the cluster (design §6.7): the metadata group's voters
// and learners, changed by conf changes its leader proposes. Any node
// takes a request (the admin API, or a node that joins, over the cluster
// transport); one that does not lead the metadata group forwards it to
// the leader (MetaLogConfig.Forward), which checks it, proposes it, and
// answers once it is applied there.

// Cluster call ops (MetaLogConfig.Forward, Broker.HandleClusterCall).
const (
	CallJoin     byte = 1 // MemberRequest → JoinAnswer
	CallRemove   byte = 2 // MemberRequest → {}
	CallTransfer byte = 3 // MemberRequest (NodeID 0: the most caught-up voter) → TransferAnswer
	CallDrain    byte = 4 // MemberRequest → {} (decommissioning: the node's replicas move off it)
)

// MemberRequest is a membership call's body (JSON).
type MemberRequest struct {
	NodeID  uint64 `json:"node_id"`
	Address string `json:"address,omitempty"`
	// Joining: the node itself asks (warrend --join): already being a
	// member at the same address is no error (a restart part-way).
	Joining bool `json:"joining,omitempty"`
}

// JoinAnswer tells a joining node the cluster's members.
type JoinAnswer struct {
	Members map[uint64]string `json:"members"`
}

// TransferAnswer names the new metadata leader.
type TransferAnswer struct {
	Leader uint64 `json:"leader"`
}

// Member is one node of the cluster as the metadata group has it.
type Member struct {
	ID      uint64 `json:"id"`
	Address string `json:"cluster_addr"`
	Role    string `json:"role"` // "voter" or "learner"
}

// ClusterMembers lists the members (ok false: no cluster), ascending by
// id, and the ids removed for good.
func (b *Broker) ClusterMembers() ([]Member, []uint64, bool) {
	cl := b.topo.cl.Load()
	if cl == nil {
		return nil, nil, false
	}
	m, cs := cl.g.Members()
	out := make([]Member, 0, len(m.Addrs))
	for _, id := range m.IDs() {
		role := "learner"
		if slices.Contains(cs.Voters, id) {
			role = "voter"
		}
		out = append(out, Member{ID: id, Address: m.Addrs[id], Role: role})
	}
	return out, m.Removed, true
}

// MetaRemoved says whether this node was removed from the cluster.
func (b *Broker) MetaRemoved() bool {
	cl := b.topo.cl.Load()
	return cl != nil && cl.removed.Load()
}

// NoteRemoved records that this node was removed from the cluster (it
// applied its own removal, or a member refused it for that reason: the
// transport's OnRemoved): it stops serving topology and says so, and
// MetaLogConfig.OnRemoved hears it once.
func (b *Broker) NoteRemoved(why string) {
	cl := b.topo.cl.Load()
	if cl == nil || cl.removed.Swap(true) {
		return
	}
	b.log.Error("this node was removed from the cluster: it no longer serves (start a node with an empty data directory and a new --node-id to add it back)", "why", why)
	if cl.onRemoved != nil {
		cl.onRemoved()
	}
}

// memberTimeout bounds a membership request end to end.
const memberTimeout = 15 * time.Second

// JoinNode adds node id at addr (its cluster port) to the cluster: a
// learner of the metadata group, promoted to voter by the leader once it
// has caught up. The node itself then starts with --join.
func (b *Broker) JoinNode(ctx context.Context, id uint64, addr string) error {
	_, err := b.memberCall(ctx, CallJoin, MemberRequest{NodeID: id, Address: addr})
	return err
}

// RemoveNode removes node id from the cluster for good (its id is never
// reused). The leader hands its leadership away first if it is the one
// removed.
func (b *Broker) RemoveNode(ctx context.Context, id uint64) error {
	_, err := b.memberCall(ctx, CallRemove, MemberRequest{NodeID: id})
	return err
}

// DecommissionNode takes node id out of the cluster in one step: no
// replica is placed on it from now on, every replica it holds moves to
// the other nodes (each queue keeps its replica count throughout: a new
// replica catches up before the old one leaves), and once it holds none
// it is removed for good (RemoveNode; its id is never reused). It waits
// for all of it, within ctx; progress, if ctx ends first, is kept: the
// moves go on, and asking again finishes the job.
func (b *Broker) DecommissionNode(ctx context.Context, id uint64) error {
	if _, err := b.memberCall(ctx, CallDrain, MemberRequest{NodeID: id}); err != nil {
		return err
	}
	tk := time.NewTicker(50 * time.Millisecond)
	defer tk.Stop()
	for {
		b.topo.mu.Lock()
		_, on := b.topo.meta.Moving(id)
		b.topo.mu.Unlock()
		if on == 0 {
			break
		}
		select {
		case <-tk.C:
		case <-ctx.Done():
			return &wire.Error{Code: wire.PreconditionFailed, Reason: fmt.Sprintf("node %d still holds %d queue replicas being moved off it (the moves go on; decommission it again to finish)", id, on)}
		}
	}
	return b.RemoveNode(ctx, id)
}

// TransferMetaLeadership hands the metadata group's leadership to node to
// (0: the voter whose log is the most caught up) and returns the new
// leader.
func (b *Broker) TransferMetaLeadership(ctx context.Context, to uint64) (uint64, error) {
	ans, err := b.memberCall(ctx, CallTransfer, MemberRequest{NodeID: to})
	if err != nil {
		return 0, err
	}
	var t TransferAnswer
	if err := json.Unmarshal(ans, &t); err != nil {
		return 0, err
	}
	return t.Leader, nil
}

// HandOffMetaLeadership is graceful shutdown's step (design §6.6): if this
// node leads the metadata group, it hands the leadership to the most
// caught-up voter, within ctx. It returns the new leader (0: this node
// did not lead, or there is no other voter).
func (b *Broker) HandOffMetaLeadership(ctx context.Context) (uint64, error) {
	cl := b.topo.cl.Load()
	if cl == nil {
		return 0, nil
	}
	st := cl.g.Status()
	if st.Lead != st.ID || cl.g.Voters() < 2 {
		return 0, nil
	}
	return cl.g.TransferLeadership(ctx, 0)
}

// HandleClusterCall answers a membership call another node made
// (cluster.Config.Handle).
func (b *Broker) HandleClusterCall(from uint64, op byte, body []byte) ([]byte, error) {
	var req MemberRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("a membership call that does not decode: %w", err)
	}
	// A member forwarded this to the leader it knows: if that is no
	// longer this node, say so (it retries with what it learns) rather
	// than forward again, or two nodes that disagree on the leader bounce
	// it between them. Only a join, from a node that knows no leader yet,
	// is carried on to the leader from here.
	if cl := b.topo.cl.Load(); cl != nil && op != CallJoin {
		if st := cl.g.Status(); st.Lead != st.ID {
			return nil, replication.ErrNotMetaLeader
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), memberTimeout)
	defer cancel()
	ans, err := b.memberCall(ctx, op, req)
	var we *wire.Error
	if errors.As(err, &we) {
		// The caller reads the code back (callError).
		return nil, fmt.Errorf("%d %s", we.Code, we.Reason)
	}
	return ans, err
}

// callError is the error a forwarded call's answer carries (the code
// HandleClusterCall put first).
func callError(msg string) *wire.Error {
	code, reason, ok := strings.Cut(msg, " ")
	if n, err := strconv.Atoi(code); ok && err == nil {
		return &wire.Error{Code: wire.Code(n), Reason: reason}
	}
	return &wire.Error{Code: wire.PreconditionFailed, Reason: msg}
}

// maxClusterAddr bounds a joining node's cluster address: a DNS name (at
// most 253 bytes) or an IP literal, a colon and a port.
const maxClusterAddr = 253 + 1 + 5 + 2

// checkClusterAddr refuses a join's address that is no HOST:PORT, before
// it is proposed: the conf change holds it with a 16-bit length, and one
// of 64 KiB or more was logged wrapped and refused at apply, its request
// answered only by its timeout.
func checkClusterAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if len(addr) > maxClusterAddr || err != nil || host == "" || port == "" {
		return &wire.Error{Code: wire.InvalidArgument, Reason: fmt.Sprintf("a node's cluster address is HOST:PORT, at most %d bytes (got %d bytes: %.64q)", maxClusterAddr, len(addr), addr)}
	}
	return nil
}

// memberCall runs op on the metadata leader: here if this node leads,
// else forwarded to it (once: the leader answers, or says it no longer
// leads, and this node tries again until ctx ends).
func (b *Broker) memberCall(ctx context.Context, op byte, req MemberRequest) ([]byte, error) {
	cl := b.topo.cl.Load()
	if cl == nil {
		return nil, &wire.Error{Code: wire.NotAllowed, Reason: "this node is not in a cluster (start the nodes with --peers, or --join)"}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, memberTimeout)
		defer cancel()
	}
	if op == CallJoin && (req.NodeID == 0 || req.Address == "") {
		return nil, &wire.Error{Code: wire.InvalidArgument, Reason: "a join needs the node's id (a number from 1) and its cluster address (HOST:PORT)"}
	}
	if op == CallJoin {
		if err := checkClusterAddr(req.Address); err != nil {
			return nil, err
		}
	}
	for {
		st := cl.g.Status()
		var ans []byte
		var err error
		switch {
		case b.MetaRemoved():
			return nil, &wire.Error{Code: wire.PreconditionFailed, Reason: "this node was removed from the cluster"}
		case st.Lead == 0:
			err = replication.ErrNotMetaLeader
		case st.Lead == st.ID:
			ans, err = b.memberHere(ctx, cl, op, req)
		case cl.forward == nil:
			return nil, &wire.Error{Code: wire.PreconditionFailed, Reason: fmt.Sprintf("this node does not lead the metadata group: ask node %d", st.Lead)}
		default:
			body, _ := json.Marshal(req)
			ans, err = cl.forward(ctx, st.Lead, op, body)
			var ce *cluster.CallError
			switch {
			case errors.As(err, &ce):
				if isRetryable(ce.Msg) {
					err = replication.ErrNotMetaLeader
				} else {
					return nil, callError(ce.Msg)
				}
			case err != nil && ctx.Err() == nil:
				// The leader this node knows is unreachable (it died, and
				// no other is elected yet, or this node has not heard):
				// again, until a leader answers.
				err = fmt.Errorf("%w: node %d, the last known, does not answer: %v", replication.ErrNotMetaLeader, st.Lead, err)
			}
		}
		if err == nil {
			return ans, nil
		}
		if !errors.Is(err, replication.ErrNotMetaLeader) && !errors.Is(err, replication.ErrChangePending) {
			var we *wire.Error
			if errors.As(err, &we) {
				return nil, we
			}
			return nil, &wire.Error{Code: codeOf(err), Reason: err.Error()}
		}
		// No leader, another leader, or a change in progress: again
		// shortly (membership changes are rare; polling is fine).
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, &wire.Error{Code: wire.PreconditionFailed, Reason: fmt.Sprintf("the cluster did not take the membership change in time (%v; it may still be applied)", err)}
		}
	}
}

func isRetryable(msg string) bool {
	return strings.Contains(msg, replication.ErrNotMetaLeader.Error()) || strings.Contains(msg, replication.ErrChangePending.Error())
}

// codeOf maps a membership error to a protocol code.
func codeOf(err error) wire.Code {
	if errors.Is(err, replication.ErrMemberUnknown) {
		return wire.NotFound
	}
	return wire.PreconditionFailed
}

// memberHere runs op on this node, the metadata leader.
func (b *Broker) memberHere(ctx context.Context, cl *metaCluster, op byte, req MemberRequest) ([]byte, error) {
	g := cl.g
	switch op {
	case CallJoin:
		err := g.ChangeMember(ctx, replication.MemberChange{Op: replication.MemberJoin, Node: req.NodeID, Addr: req.Address})
		if err != nil && !(req.Joining && errors.Is(err, replication.ErrMemberExists)) {
			return nil, err
		}
		m, _ := g.Members()
		b.topo.placeIfNeeded() // replicas move to it (moves.go)
		return json.Marshal(JoinAnswer{Members: m.Addrs})
	case CallRemove:
		if err := g.CheckChange(replication.MemberChange{Op: replication.MemberRemove, Node: req.NodeID}); err != nil {
			return nil, err
		}
		if st := g.Status(); req.NodeID == st.ID {
			// The leader leaves: hand the leadership on first, and let
			// the new leader remove this node.
			tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := g.TransferLeadership(tctx, 0)
			cancel()
			if err != nil {
				return nil, err
			}
			return nil, replication.ErrNotMetaLeader
		}
		if err := g.ChangeMember(ctx, replication.MemberChange{Op: replication.MemberRemove, Node: req.NodeID}); err != nil {
			return nil, err
		}
		b.topo.placeIfNeeded() // its replicas go to the others (moves.go)
		return []byte("{}"), nil
	case CallDrain:
		if err := g.CheckChange(replication.MemberChange{Op: replication.MemberRemove, Node: req.NodeID}); err != nil {
			return nil, err
		}
		cl := b.topo.cl.Load()
		if err := b.topo.clusterChange(cl, &MetaCommand{Op: MetaPlaceReplicas, Replicas: []uint64{req.NodeID}}).Err(); err != nil {
			return nil, err
		}
		return []byte("{}"), nil
	case CallTransfer:
		lead, err := g.TransferLeadership(ctx, req.NodeID)
		if err != nil {
			return nil, err
		}
		return json.Marshal(TransferAnswer{Leader: lead})
	}
	return nil, fmt.Errorf("unknown membership call %d", op)
}

// StepClusterSnapshot hands group gid a snapshot a peer sent (the
// transport's DeliverSnapshot): the metadata group's, or a replicated
// queue's (StepSnapshot).
func (b *Broker) StepClusterSnapshot(gid uint64, s *replication.SnapshotMessage) {
	if gid == replication.MetaGroupID {
		if g := b.topo.mlog.Load(); g != nil {
			g.StepSnapshot(s)
		}
		return
	}
	b.StepSnapshot(gid, s)
}
