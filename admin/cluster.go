package admin

import (
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/warren-mq/warren/wire"
)

// ClusterNode is one node of the cluster as this node sees it.
type ClusterNode struct {
	ID          uint64 `json:"id"`
	ClusterAddr string `json:"cluster_addr"`
	// Role in the metadata group: "voter" or "learner" (a node that
	// joined, until it has caught up; past 5 voters).
	Role string `json:"role,omitempty"`
	Self bool   `json:"self"`
	// Connected: this node's connection to it is up (always true for
	// itself).
	Connected bool `json:"connected"`
}

// ClusterStatus is GET /api/cluster: the nodes, and the metadata group
// as this node sees it (its leader, term, and how far this node has
// committed and applied it). A single node is a cluster of one.
type ClusterStatus struct {
	Node       uint64        `json:"node"`
	Nodes      []ClusterNode `json:"nodes"`
	MetaLeader uint64        `json:"meta_leader"` // 0: none known
	Term       uint64        `json:"term"`
	Commit     uint64        `json:"commit_index"`
	Applied    uint64        `json:"applied_index"`
	Ready      bool          `json:"ready"` // as /readyz
}

// SetClusterNodes gives the API the cluster's nodes (warrend, from
// --peers and its transport); call it before serving. Without it the
// node is a cluster of one.
func (a *API) SetClusterNodes(fn func() []ClusterNode) { a.clusterNodes = fn }

// MemberChange is the body of POST /api/cluster/join, /leave,
// /decommission and /transfer-leadership.
type MemberChange struct {
	NodeID  uint64 `json:"node_id"`
	Address string `json:"address,omitempty"` // join: the node's cluster address, HOST:PORT
}

// decommissionTimeout bounds POST /api/cluster/decommission: the moves go
// on past it, and the request may be made again to finish.
const decommissionTimeout = 10 * time.Minute

// Leadership answers POST /api/cluster/transfer-leadership.
type Leadership struct {
	Leader uint64 `json:"leader"`
}

// Membership changes (administrator only, as every write): any node
// takes them and the metadata leader applies them (design §6.7).
func (a *API) clusterRoutes() {
	a.mux.HandleFunc("GET /api/cluster", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, a.clusterStatus()) })
	a.mux.HandleFunc("POST /api/cluster/join", func(w http.ResponseWriter, r *http.Request) {
		var body MemberChange
		if err := decode(r, &body); err != nil {
			writeErr(w, err)
			return
		}
		if err := a.b.JoinNode(r.Context(), body.NodeID, body.Address); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	a.mux.HandleFunc("POST /api/cluster/leave", func(w http.ResponseWriter, r *http.Request) {
		var body MemberChange
		if err := decode(r, &body); err != nil {
			writeErr(w, err)
			return
		}
		if body.NodeID == 0 {
			writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "node_id: the id of the node to remove, a number from 1"})
			return
		}
		if err := a.b.RemoveNode(r.Context(), body.NodeID); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	a.mux.HandleFunc("POST /api/cluster/decommission", func(w http.ResponseWriter, r *http.Request) {
		var body MemberChange
		if err := decode(r, &body); err != nil {
			writeErr(w, err)
			return
		}
		if body.NodeID == 0 {
			writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "node_id: the id of the node to decommission, a number from 1"})
			return
		}
		// Moving every replica off the node takes as long as the
		// copies do: bounded, and resumable by asking again.
		ctx, cancel := context.WithTimeout(r.Context(), decommissionTimeout)
		defer cancel()
		if err := a.b.DecommissionNode(ctx, body.NodeID); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	a.mux.HandleFunc("POST /api/cluster/transfer-leadership", func(w http.ResponseWriter, r *http.Request) {
		var body MemberChange
		if r.ContentLength != 0 {
			if err := decode(r, &body); err != nil {
				writeErr(w, err)
				return
			}
		}
		lead, err := a.b.TransferMetaLeadership(r.Context(), body.NodeID)
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, 200, Leadership{Leader: lead})
	})
}

func (a *API) clusterStatus() ClusterStatus {
	var cs ClusterStatus
	if st, ok := a.b.MetaStatus(); ok {
		cs = ClusterStatus{Node: st.Node, MetaLeader: st.Leader, Term: st.Term, Commit: st.Commit, Applied: st.Applied}
	}
	cs.Ready = a.b.MetaReady()
	if a.clusterNodes != nil {
		cs.Nodes = a.clusterNodes()
		slices.SortFunc(cs.Nodes, func(x, y ClusterNode) int { return int(x.ID) - int(y.ID) })
	} else {
		cs.Nodes = []ClusterNode{{ID: max(cs.Node, 1), Self: true, Connected: true}}
	}
	return cs
}
