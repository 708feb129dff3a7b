// Package cluster holds the tests of cluster.sh (make cluster).
package cluster

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// make cluster with one of a node's ports already taken (a make run broker
// on 5680/15680, the README's own first step) refuses before starting any
// node, naming the port. It used to start the nodes and, since the other
// process answered node 1's /readyz, report all three ready while node 1
// had exited on "address already in use".
func TestStartRefusesAPortInUse(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl")
	}
	// An impostor on node 1's HTTP port that says it is ready.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ready\n")) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	base := ln.Addr().(*net.TCPAddr).Port - 10000
	if base < 1024 {
		t.Skipf("the free port %d leaves no room for PORT_BASE", base+10000)
	}
	dir := t.TempDir()
	// A warrend that leaves a mark and stays up, serving nothing.
	fake := filepath.Join(dir, "warrend")
	marks := filepath.Join(dir, "started")
	if err := os.WriteFile(fake, []byte("#!/usr/bin/env bash\necho \"$@\" >> "+marks+"\nexec sleep 5\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	cmd := exec.Command("bash", "cluster.sh", "start")
	cmd.Env = append(os.Environ(), "WARREND="+fake, "DATA="+data, "PORT_BASE="+strconv.Itoa(base))
	stop := func() {
		c := exec.Command("bash", "cluster.sh", "stop")
		c.Env = cmd.Env
		c.Run()
	}
	t.Cleanup(stop)
	out, err := cmd.CombinedOutput()
	want := "127.0.0.1:" + strconv.Itoa(base+10000) + " is in use"
	if err == nil || !strings.Contains(string(out), " is in use") {
		t.Fatalf("cluster.sh start with node 1's HTTP port taken: %v\n%s\nwant a refusal saying %q", err, out, want)
	}
	if b, _ := os.ReadFile(marks); len(b) > 0 {
		t.Fatalf("nodes were started anyway:\n%s", b)
	}
}
