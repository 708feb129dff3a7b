package main

import (
	"encoding/json"
	"strings"
	"testing"

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
