package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestClusterFlags: --node-id, --peers, --cluster-listen and the cluster
// secret are validated with errors that say what to do (a valid
// multi-node configuration starts: TestClusterChildren).
func TestClusterFlags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "secret")
	os.WriteFile(good, []byte("0123456789abcdef0123\n"), 0o600)
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("tiny\n"), 0o600)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	peers := "1=127.0.0.1:5682,2=127.0.0.1:5692,3=127.0.0.1:5702"
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--node-id", "x", "--peers", peers}, nil, "--node-id \"x\""},
		{[]string{"--node-id", "0", "--peers", peers}, nil, "from 1"},
		{[]string{"--peers", peers}, nil, "--peers needs --node-id"},
		{[]string{"--node-id", "2"}, nil, "--node-id needs --peers"},
		{[]string{"--cluster-listen", "127.0.0.1:5682"}, nil, "--cluster-listen needs --peers"},
		{[]string{"--node-id", "4", "--peers", peers, "--cluster-secret-file", good}, nil, "not in --peers"},
		{[]string{"--node-id", "1", "--peers", "1=a:1,1=b:2", "--cluster-secret-file", good}, nil, "named twice"},
		{[]string{"--node-id", "1", "--peers", "1=a:x", "--cluster-secret-file", good}, nil, "port"},
		{[]string{"--node-id", "1", "--peers", peers}, nil, "needs a shared secret"},
		{[]string{"--node-id", "1", "--peers", peers, "--cluster-secret-file", short}, nil, "at least 16 bytes"},
		{[]string{"--node-id", "1", "--peers", peers, "--cluster-secret-file", empty}, nil, "is empty"},
		{[]string{"--node-id", "1", "--peers", peers, "--cluster-secret-file", filepath.Join(dir, "nope")}, nil, "cluster secret file"},
		{[]string{"--node-id", "1", "--peers", peers, "--cluster-listen", "a:b:c"}, map[string]string{"WARREN_CLUSTER_SECRET": "0123456789abcdef"}, "--cluster-listen \"a:b:c\""},
		{[]string{"--node-id", "2", "--peers", "2=127.0.0.1:5692"}, nil, "a single node is node 1"},
	} {
		env := func(k string) string { return c.env[k] }
		args := append([]string{"--data", t.TempDir(), "--listen", "127.0.0.1:0", "--http", "off"}, c.args...)
		err := run(context.Background(), args, env, strings.NewReader(""), io.Discard, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: got %v, want an error saying %q", c.args, c.env, err, c.want)
		}
	}
}

// TestClusterSettings: what a valid set of flags gives.
func TestClusterSettings(t *testing.T) {
	env := func(k string) string {
		if k == "WARREN_CLUSTER_SECRET" {
			return "0123456789abcdef"
		}
		return ""
	}
	cc, err := clusterSettings("2", "", "1=h1,2=h2:7000,3=h3", "", "", env)
	if err != nil {
		t.Fatal(err)
	}
	if cc.NodeID != 2 || cc.Listen != "h2:7000" || cc.Peers[1] != "h1:5682" || string(cc.Secret) != "0123456789abcdef" {
		t.Fatalf("got %+v", cc)
	}
	cc, err = clusterSettings("2", "0.0.0.0", "1=h1,2=h2:7000,3=h3", "", "", env)
	if err != nil || cc.Listen != "0.0.0.0:5682" {
		t.Fatalf("--cluster-listen without a port: %+v, %v", cc, err)
	}
	if cc, err := clusterSettings("", "", "", "", "", env); cc != nil || err != nil {
		t.Fatalf("no cluster flags: %+v, %v", cc, err)
	}
}
