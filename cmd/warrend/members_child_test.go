package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-mq/warren/admin"
)

// post sends an administrator's POST to node n's admin API.
func (n *clusterChild) post(t *testing.T, path string, body any) (int, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", "http://"+n.http+path, bytes.NewReader(b))
	req.SetBasicAuth("guest", "guest")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.String()
}

// waitStatus polls node n's GET /api/cluster until ok holds (20 s).
func (n *clusterChild) waitStatus(t *testing.T, what string, ok func(admin.ClusterStatus) bool) admin.ClusterStatus {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		cs, code := n.clusterStatus(t)
		if code == 200 && ok(cs) {
			return cs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s (last: %d %+v)", what, code, cs)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}

// TestClusterChildrenMembership: a fourth warrend joins a running
// three-node cluster with --join (a learner, then a voter); the metadata
// leader stopped with SIGTERM hands its leadership on before it exits
// (the others know the new leader at once, without waiting out an
// election timeout); an administrator removes the joined node through
// the admin API, and it stops and refuses to start again.
func TestClusterChildrenMembership(t *testing.T) {
	if testing.Short() {
		t.Skip("starts warrend processes")
	}
	dir := t.TempDir()
	ports := freePorts(t, 4)
	nodes := startClusterChildren(t, dir, ports[:3])
	secret := filepath.Join(dir, "secret")

	args4 := fmt.Sprintf("--listen 127.0.0.1:0 --http 127.0.0.1:0 --log-level warn --disk-free-limit -1 --data %s --node-id 4 --join %s --cluster-listen %s --cluster-secret-file %s",
		filepath.Join(dir, "node4"), ports[0], ports[3], secret)
	ready := make(chan error, 1)
	n4 := startChildArgs(t, 4, args4, ready)
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("node 4 did not serve within 30 s")
	}
	cs := nodes[1].waitStatus(t, "node 4 a voter", func(cs admin.ClusterStatus) bool {
		for _, n := range cs.Nodes {
			if n.ID == 4 {
				return n.Role == "voter" && n.Connected
			}
		}
		return false
	})
	if len(cs.Nodes) != 4 {
		t.Fatalf("members after the join: %+v", cs.Nodes)
	}
	// Bad input gets a clear error.
	if code, body := nodes[0].post(t, "/api/cluster/join", map[string]any{"node_id": 4, "address": ports[3]}); code != 409 || !strings.Contains(body, "already a member") {
		t.Fatalf("joining node 4 twice: %d %s", code, body)
	}
	if code, body := nodes[0].post(t, "/api/cluster/leave", map[string]any{"node_id": 9}); code != 404 || !strings.Contains(body, "not a member") {
		t.Fatalf("removing an unknown node: %d %s", code, body)
	}
	if code, body := nodes[0].post(t, "/api/cluster/decommission", map[string]any{"node_id": 9}); code != 404 || !strings.Contains(body, "not a member") {
		t.Fatalf("decommissioning an unknown node: %d %s", code, body)
	}

	// SIGTERM to the metadata leader: it hands the leadership on first.
	lead := cs.MetaLeader
	all := append(nodes, n4)
	leader := all[lead-1]
	if err := leader.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := leader.cmd.Wait(); err != nil {
		t.Fatalf("the leader's graceful stop: %v", err)
	}
	var other *clusterChild
	for _, n := range all {
		if n != leader {
			other = n
			break
		}
	}
	// Without the hand-off the others would still name the stopped node
	// for an election timeout (1-2 s); with it they named the new leader
	// before the old one exited. 0.9 s, under the shortest election
	// timeout, leaves room for a loaded machine (0.5 s was tight under
	// -race beside other work).
	deadline := time.Now().Add(900 * time.Millisecond)
	for {
		cs, _ := other.clusterStatus(t)
		if cs.MetaLeader != 0 && cs.MetaLeader != lead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("0.9 s after the leader stopped, node's view: %+v (no hand-off?)", cs)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}

	// Decommission node 4 (unless it was the leader stopped above): it
	// holds no replica, and is removed.
	if lead != 4 {
		if code, body := other.post(t, "/api/cluster/decommission", map[string]any{"node_id": 4}); code != 204 {
			t.Fatalf("decommissioning node 4: %d %s", code, body)
		}
		err := n4.cmd.Wait()
		if err == nil {
			t.Fatal("node 4 removed: it exited 0")
		}
		// Started again, it refuses, and says why.
		err = run(context.Background(), strings.Fields(args4), func(string) string { return "" }, strings.NewReader(""), io.Discard, io.Discard, nil)
		if err == nil || !strings.HasPrefix(err.Error(), "node 4 was removed from the cluster: it cannot serve again") {
			t.Fatalf("restarting the removed node 4: %v", err) // once, not "(this node was removed …)" after it
		}
	}
}

// startChildArgs starts a warrend child with args and reports on ready
// once it serves.
func startChildArgs(t *testing.T, id int, args string, ready chan<- error) *clusterChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWarrendChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "WARREND_TEST_CHILD="+args)
	cmd.Stderr = os.Stderr
	return startChildCmd(t, id, cmd, ready)
}
