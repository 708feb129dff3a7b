package admin

import (
	"net/http"
	"slices"
)

// ClusterNode is one node of the cluster as this node sees it.
type ClusterNode struct {
	ID          uint64 `json:"id"`
	ClusterAddr string `json:"cluster_addr"`
	Self        bool   `json:"self"`
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

func (a *API) clusterRoutes() {
	a.mux.HandleFunc("GET /api/cluster", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, a.clusterStatus()) })
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
