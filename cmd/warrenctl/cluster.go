package main

import (
	"encoding/json"
	"fmt"
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
	}
	return usageErr{"cluster: want status"}
}
