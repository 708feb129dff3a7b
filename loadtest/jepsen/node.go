package jepsen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warren-mq/warren/internal/freeport"
)

// node is one warrend process on loopback, restarted on the same data
// directory and ports.
type node struct {
	id     int
	bin    string
	dir    string // data directory
	listen string // native protocol
	http   string
	// private, if set, is the native and HTTP addresses the next start
	// listens on instead, which no client knows (the harness's look at a
	// damaged single node: clients read listen, through url, at any
	// time, so it never changes)
	private [2]string
	args    []string // cluster flags
	// clusterAddr: the cluster port it listens on (a cluster's node;
	// peers reach it through proxies, a node rebuilt directly)
	clusterAddr string
	env         []string
	logPath     string
	mu          sync.Mutex
	cmd         *exec.Cmd
	exited      chan struct{} // closed when cmd ends
	exitErr     error
	stopped     bool // SIGSTOPped
	expectEnd   bool // the harness killed it
}

// freePort returns a loopback address no one listens on now, outside the
// kernel's ephemeral range (freeport): a node is handed it and restarted
// on it, and a freed ephemeral port may be taken meanwhile by any
// 127.0.0.1:0 listener or dial, the node's own included.
func freePort() (string, error) { return freeport.Addr() }

func (n *node) url() string { return "warren://guest:guest@" + n.listen }

// start starts warrend and waits until /readyz says it serves. A process
// that exits first is an error holding the end of its log.
func (n *node) start(ctx context.Context, timeout time.Duration) error {
	n.mu.Lock()
	if n.cmd != nil {
		n.mu.Unlock()
		return fmt.Errorf("node %d: already running", n.id)
	}
	lf, err := os.OpenFile(n.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		n.mu.Unlock()
		return err
	}
	fmt.Fprintf(lf, "--- start %s\n", time.Now().Format(time.RFC3339Nano))
	listen, hp := n.listen, n.http
	if n.private[0] != "" {
		listen, hp = n.private[0], n.private[1]
	}
	args := append([]string{"--listen", listen, "--http", hp, "--data", n.dir, "--log-level", "warn",
		"--disk-free-limit", "-1"}, n.args...)
	cmd := exec.Command(n.bin, args...)
	cmd.Env = append(os.Environ(), n.env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		n.mu.Unlock()
		return fmt.Errorf("node %d: %w", n.id, err)
	}
	n.cmd, n.exited, n.exitErr, n.stopped, n.expectEnd = cmd, make(chan struct{}), nil, false, false
	exited := n.exited
	n.mu.Unlock()
	go func() {
		err := cmd.Wait()
		lf.Close()
		n.mu.Lock()
		n.exitErr = err
		if n.cmd == cmd {
			n.cmd = nil
		}
		n.mu.Unlock()
		close(exited)
	}()
	deadline := time.Now().Add(timeout)
	cl := http.Client{Timeout: time.Second}
	for {
		select {
		case <-exited:
			n.mu.Lock()
			n.expectEnd = true
			n.mu.Unlock()
			return &startError{node: n.id, err: n.exitErr, log: n.logTail(4096)}
		default:
		}
		if resp, err := cl.Get("http://" + hp + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			n.kill()
			return fmt.Errorf("node %d: not ready within %v; log:\n%s", n.id, timeout, n.logTail(2048))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startError is a warrend that exited instead of serving.
type startError struct {
	node int
	err  error
	log  string
}

func (e *startError) Error() string {
	return fmt.Sprintf("node %d exited at start (%v): %s", e.node, e.err, lastLines(e.log, 3))
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, " | ")
}

// kill sends SIGKILL and waits for the process to end.
func (n *node) kill() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.expectEnd = true
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// stop sends SIGTERM (a graceful stop: leaderships handed off) and waits
// for the process to end, or kills it after limit; it reports whether the
// process ended by itself.
func (n *node) stop(limit time.Duration) bool { return n.end(syscall.SIGTERM, limit) }

// end sends sig (none if 0: the process is to end by itself, as a node
// removed from the cluster does) and waits for the process to end, or
// kills it after limit; it reports whether the process ended by itself.
func (n *node) end(sig syscall.Signal, limit time.Duration) bool {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.expectEnd = true
	n.mu.Unlock()
	if cmd == nil {
		return true
	}
	if sig != 0 {
		_ = cmd.Process.Signal(sig)
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-exited:
		return true
	case <-t.C:
		n.kill()
		return false
	}
}

// pause sends SIGSTOP, resume SIGCONT.
func (n *node) signal(sig syscall.Signal) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		_ = n.cmd.Process.Signal(sig)
		n.stopped = sig == syscall.SIGSTOP
	}
}

// running reports whether the process is up; an end the harness did not
// cause is returned once as unexpected.
func (n *node) running() (up bool, unexpected error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return true, nil
	}
	if !n.expectEnd {
		n.expectEnd = true
		return false, fmt.Errorf("node %d exited by itself (%v): %s", n.id, n.exitErr, lastLines(n.logTail(4096), 3))
	}
	return false, nil
}

func (n *node) logTail(max int) string {
	b, _ := os.ReadFile(n.logPath)
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// logFiles lists the node's log files (wal-*.log, seg-*.seg) with sizes.
func (n *node) logFiles() (map[string]int64, error) {
	dir := filepath.Join(n.dir, "log")
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, e := range es {
		name := e.Name()
		if !(strings.HasPrefix(name, "wal-") || strings.HasPrefix(name, "seg-")) {
			continue
		}
		if fi, err := e.Info(); err == nil && fi.Size() > 16 {
			out[filepath.Join(dir, name)] = fi.Size()
		}
	}
	return out, nil
}

// backup copies the data directory to dst; restore puts it back.
func copyDir(src, dst string) error {
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		t := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(t, 0o750)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		return os.WriteFile(t, b, 0o640)
	})
}

// flipBit flips bit of the byte at off in path.
func flipBit(path string, off int64, bit uint) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		return err
	}
	b[0] ^= 1 << bit
	_, err = f.WriteAt(b, off)
	return err
}

func (n *node) logSize() int64 {
	fi, err := os.Stat(n.logPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func (n *node) logSince(off int64) string {
	b, _ := os.ReadFile(n.logPath)
	if off > int64(len(b)) {
		return ""
	}
	return string(b[off:])
}

// mentions reports whether warrend's refusal names the damaged file (by
// base name) and which queue, if any, it names.
func mentions(log, file string) (namesFile bool, queue string) {
	namesFile = strings.Contains(log, filepath.Base(file))
	if i := strings.Index(log, "queue="); i >= 0 {
		rest := log[i+len("queue="):]
		if j := strings.IndexAny(rest, " :,\n"); j > 0 {
			queue = strings.Trim(rest[:j], `"'`)
		}
	}
	return namesFile, queue
}

// getJSON asks this node's admin API (as guest) for path and decodes the
// answer into out.
// post sends an administrator's POST with a JSON body to the node's admin
// API; any answer but 2xx is an error naming it.
func (n *node) post(ctx context.Context, path string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, "POST", "http://"+n.http+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.SetBasicAuth("guest", "guest")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("node %d: POST %s: %s: %s", n.id, path, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

func (n *node) getJSON(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+n.http+path, nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth("guest", "guest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("node %d: GET %s: %s: %s", n.id, path, resp.Status, strings.TrimSpace(string(b)))
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out)
}
