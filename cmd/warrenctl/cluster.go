package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"text/tabwriter"
)

// cluster: warrenctl cluster … over /api/cluster (issue 14).
func (c *cli) cluster(verb string, args []string) error {
	switch verb {
	case "status":
		if err := none("cluster status", args); err != nil {
			return err
		}
		var raw json.RawMessage
		if err := c.call("GET", "/api/cluster", nil, &raw); err != nil {
			return err
		}
		var cs struct {
			Node  uint64 `json:"node"`
			Nodes []struct {
				ID          uint64 `json:"id"`
				ClusterAddr string `json:"cluster_addr"`
				Role        string `json:"role"`
				Self        bool   `json:"self"`
				Connected   bool   `json:"connected"`
			} `json:"nodes"`
			MetaLeader uint64 `json:"meta_leader"`
			Term       uint64 `json:"term"`
			Commit     uint64 `json:"commit_index"`
			Applied    uint64 `json:"applied_index"`
			Ready      bool   `json:"ready"`
		}
		if err := json.Unmarshal(raw, &cs); err != nil {
			return fmt.Errorf("GET /api/cluster: %w", err)
		}
		return c.show(raw, func(w *tabwriter.Writer) error {
			leader := "none known"
			if cs.MetaLeader != 0 {
				leader = fmt.Sprintf("node %d", cs.MetaLeader)
			}
			fmt.Fprintf(w, "metadata leader: %s, term %d; node %d has applied %d of %d committed (ready: %v)\n",
				leader, cs.Term, cs.Node, cs.Applied, cs.Commit, cs.Ready)
			fmt.Fprintln(w, "NODE\tCLUSTER ADDRESS\tROLE\tREACHABLE")
			for _, n := range cs.Nodes {
				role, self := "follower", ""
				if n.ID == cs.MetaLeader {
					role = "leader"
				} else if n.Role == "learner" {
					role = "learner"
				}
				if n.Self {
					self = " (this node)"
				}
				addr := n.ClusterAddr
				if addr == "" {
					addr = "-"
				}
				fmt.Fprintf(w, "%d%s\t%s\t%s\t%v\n", n.ID, self, addr, role, n.Connected)
			}
			return nil
		})
	case "join":
		// warrenctl cluster join ADDR NODE: add node NODE, whose cluster
		// port is ADDR (the node itself starts with --join).
		if len(args) != 2 {
			return usageErr{"cluster join: want ADDR NODE (the new node's cluster address HOST:PORT and its id)"}
		}
		id, err := nodeArg("cluster join", args[1])
		if err != nil {
			return err
		}
		if err := c.call("POST", "/api/cluster/join", map[string]any{"node_id": id, "address": args[0]}, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.out, "node %d (%s) added to the cluster: a learner of the metadata group until it has caught up\n", id, args[0])
		return nil
	case "leave":
		if len(args) != 1 {
			return usageErr{"cluster leave: want NODE (the id of the node to remove)"}
		}
		id, err := nodeArg("cluster leave", args[0])
		if err != nil {
			return err
		}
		if err := c.call("POST", "/api/cluster/leave", map[string]any{"node_id": id}, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.out, "node %d removed from the cluster (it stops; its id is never reused)\n", id)
		return nil
	case "decommission":
		if len(args) != 1 {
			return usageErr{"cluster decommission: want NODE (the id of the node to take out)"}
		}
		id, err := nodeArg("cluster decommission", args[0])
		if err != nil {
			return err
		}
		if err := c.call("POST", "/api/cluster/decommission", map[string]any{"node_id": id}, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.out, "node %d decommissioned: its queue replicas moved to the other nodes, and it was removed (it stops; its id is never reused)\n", id)
		return nil
	case "transfer-leadership":
		if len(args) > 1 {
			return usageErr{"cluster transfer-leadership: want at most NODE (default: the most caught-up voter)"}
		}
		var id uint64
		if len(args) == 1 {
			var err error
			if id, err = nodeArg("cluster transfer-leadership", args[0]); err != nil {
				return err
			}
		}
		var out struct {
			Leader uint64 `json:"leader"`
		}
		if err := c.call("POST", "/api/cluster/transfer-leadership", map[string]any{"node_id": id}, &out); err != nil {
			return err
		}
		fmt.Fprintf(c.out, "node %d leads the metadata group\n", out.Leader)
		return nil
	}
	return usageErr{"cluster: want status, join, leave, decommission or transfer-leadership"}
}

func nodeArg(cmd, s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, usageErr{fmt.Sprintf("%s: %q is not a node id (a number from 1)", cmd, s)}
	}
	return id, nil
}
