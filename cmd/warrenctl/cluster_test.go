package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/netio"
)

// TestClusterStatus: warrenctl cluster status shows the nodes and the
// metadata group's leader; a single node with a data directory is a
// cluster of one that leads its own metadata group.
func TestClusterStatus(t *testing.T) {
	c := newCtl(t, &netio.Config{DataDir: t.TempDir()})
	out := c.ok("", "cluster", "status")
	if !strings.Contains(out, "metadata leader: node 1") || !regexpLine(out, "1", "(this", "leader", "true") {
		t.Fatalf("cluster status:\n%s", out)
	}
	var cs map[string]any
	if err := json.Unmarshal([]byte(c.ok("", "--json", "cluster", "status")), &cs); err != nil {
		t.Fatal(err)
	}
	if cs["meta_leader"] != 1.0 || cs["ready"] != true || cs["applied_index"].(float64) < 1 {
		t.Fatalf("cluster status --json: %v", cs)
	}
	if _, errs, code := c.run("", "cluster", "nope"); code != 2 || !strings.Contains(errs, "want status") {
		t.Fatalf("cluster nope: exit %d %s", code, errs)
	}
}

// queue list's THIS NODE column: what the answering node's replica is,
// whose counts the row shows.
func TestReplicaHere(t *testing.T) {
	for _, c := range []struct {
		q    api.QueueStats
		want string
	}{
		{api.QueueStats{}, "-"},
		{api.QueueStats{RaftRole: "leader", Leader: 1, RaftCommit: 9, RaftApplied: 9}, "leader"},
		{api.QueueStats{RaftRole: "follower", Leader: 1, RaftCommit: 9, RaftApplied: 9}, "follower"},
		{api.QueueStats{RaftRole: "follower", Leader: 1, RaftCommit: 9, RaftApplied: 4}, "follower, applying 5"},
		{api.QueueStats{RaftRole: "follower", RaftCommit: 9, RaftApplied: 9}, "follower, no leader known"},
		{api.QueueStats{RaftRole: "none", Leader: 2}, "no replica"},
		{api.QueueStats{RaftRole: "failed", ReplicaError: "damaged"}, "failed: damaged"},
	} {
		if got := replicaHere(c.q); got != c.want {
			t.Errorf("%+v: %q, want %q", c.q, got, c.want)
		}
	}
}
