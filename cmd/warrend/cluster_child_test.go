package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/wire"
)

// clusterChild is one warrend of a three-node cluster in a child process.
type clusterChild struct {
	cmd        *exec.Cmd
	addr, http string
}

// startClusterChildren starts warrend node 1..3 at once (each waits for
// the others before it serves) and returns them once all three serve.
func startClusterChildren(t *testing.T, dir string, ports []string) []*clusterChild {
	t.Helper()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("a-test-secret-of-32-bytes-or-so!\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	peers := fmt.Sprintf("1=%s,2=%s,3=%s", ports[0], ports[1], ports[2])
	nodes := make([]*clusterChild, 3)
	ready := make(chan error, 3)
	for i := range nodes {
		nodes[i] = startClusterChild(t, i+1, dir, peers, secret, ready)
	}
	for range nodes {
		select {
		case err := <-ready:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the cluster did not start within 30 s")
		}
	}
	return nodes
}

func startClusterChild(t *testing.T, id int, dir, peers, secret string, ready chan<- error) *clusterChild {
	data := filepath.Join(dir, fmt.Sprintf("node%d", id))
	cmd := exec.Command(os.Args[0], "-test.run=^TestWarrendChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("WARREND_TEST_CHILD=--listen 127.0.0.1:0 --http 127.0.0.1:0 --log-level warn --disk-free-limit -1 --data %s --node-id %d --peers %s --cluster-secret-file %s",
		data, id, peers, secret))
	cmd.Stderr = os.Stderr
	return startChildCmd(t, id, cmd, ready)
}

// startChildCmd starts cmd (a warrend child) and reports on ready once it
// serves (its READY line).
func startChildCmd(t *testing.T, id int, cmd *exec.Cmd, ready chan<- error) *clusterChild {
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	n := &clusterChild{cmd: cmd}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "READY" {
				n.addr, n.http = f[1], f[2]
				ready <- nil
				return
			}
		}
		ready <- fmt.Errorf("warrend node %d exited before serving", id)
	}()
	return n
}

func (n *clusterChild) clusterStatus(t *testing.T) (admin.ClusterStatus, int) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+n.http+"/api/cluster", nil)
	req.SetBasicAuth("guest", "guest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return admin.ClusterStatus{}, 0
	}
	defer resp.Body.Close()
	var cs admin.ClusterStatus
	_ = json.NewDecoder(resp.Body).Decode(&cs)
	return cs, resp.StatusCode
}

func (n *clusterChild) readyz() int {
	resp, err := http.Get("http://" + n.http + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestClusterChildren: three warrend processes on loopback form a
// cluster: each serves once the metadata group has a leader (/readyz
// 200), GET /api/cluster names the nodes and the leader, a queue declared
// on one node is seen on the others, and with the leader killed (-9) the
// other two elect another and still take topology changes.
func TestClusterChildren(t *testing.T) {
	if testing.Short() {
		t.Skip("starts warrend processes")
	}
	dir := t.TempDir()
	nodes := startClusterChildren(t, dir, freePorts(t, 3))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var lead uint64
	for _, n := range nodes {
		if code := n.readyz(); code != 200 {
			t.Fatalf("/readyz of a serving node: %d", code)
		}
		cs, code := n.clusterStatus(t)
		if code != 200 || len(cs.Nodes) != 3 || cs.MetaLeader == 0 || cs.Applied == 0 {
			t.Fatalf("GET /api/cluster: %d %+v", code, cs)
		}
		lead = cs.MetaLeader
	}
	declare := func(n *clusterChild, name string, passive bool) error {
		c, err := client.Dial(ctx, "warren://guest:guest@"+n.addr)
		if err != nil {
			return err
		}
		defer c.Close()
		ch, err := c.Channel(ctx)
		if err != nil {
			return err
		}
		_, err = ch.DeclareQueue(ctx, name, client.QueueOptions{Durable: true, Passive: passive})
		return err
	}
	seen := func(n *clusterChild, name string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := declare(n, name, true)
			if err == nil {
				return
			}
			var we *wire.Error
			if !errors.As(err, &we) || we.Code != wire.NotFound || time.Now().After(deadline) {
				t.Fatalf("queue %s on %s: %v", name, n.addr, err)
			}
			time.Sleep(20 * time.Millisecond) // polling with a deadline
		}
	}
	if err := declare(nodes[0], "orders", false); err != nil {
		t.Fatal(err)
	}
	seen(nodes[1], "orders")
	seen(nodes[2], "orders")
	exclusiveIsolated(t, ctx, nodes[0], nodes[1])
	transientAcrossNodes(t, ctx, nodes[0], nodes[1], nodes[2])

	leader := nodes[lead-1]
	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = leader.cmd.Wait()
	var rest []*clusterChild
	for _, n := range nodes {
		if n != leader {
			rest = append(rest, n)
		}
	}
	// The survivors elect a leader (not the dead one) and take changes.
	deadline := time.Now().Add(20 * time.Second)
	for {
		cs, _ := rest[0].clusterStatus(t)
		if cs.MetaLeader != 0 && cs.MetaLeader != lead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new metadata leader after the leader's kill -9: %+v", cs)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	if err := declare(rest[0], "after-kill", false); err != nil {
		t.Fatal(err)
	}
	seen(rest[1], "after-kill")
}

// exclusiveIsolated: an exclusive queue declared through node a belongs to
// its connection there: a connection on node b cannot use it, and closing
// one does not delete it, even one whose count matches the owner's.
// Connection ids are node << 32 | a count per node; when they were the
// bare count, b's connection with the owner's number used the queue and
// deleted it cluster-wide on closing.
func exclusiveIsolated(t *testing.T, ctx context.Context, a, b *clusterChild) {
	t.Helper()
	dial := func(n *clusterChild) (*client.Conn, *client.Channel) {
		t.Helper()
		c, err := client.Dial(ctx, "warren://guest:guest@"+n.addr)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := c.Channel(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return c, ch
	}
	other, och := dial(b)
	defer other.Close()
	// The owner: a's connection whose count is other's (or the first past it).
	var own *client.Conn
	var ch *client.Channel
	for range 200 {
		c, cch := dial(a)
		if c.ID&(1<<32-1) >= other.ID&(1<<32-1) {
			own, ch = c, cch
			break
		}
		c.Close()
	}
	if own == nil {
		t.Fatalf("no connection on %s numbered like %d", a.addr, other.ID)
	}
	defer own.Close()
	if own.ID == other.ID || own.ID>>32 == other.ID>>32 {
		t.Fatalf("connection ids %#x (%s) and %#x (%s): not told apart by node", own.ID, a.addr, other.ID, b.addr)
	}
	if _, err := ch.DeclareQueue(ctx, "mine", client.QueueOptions{Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := och.DeclareQueue(ctx, "mine", client.QueueOptions{Passive: true})
		if wire.CodeOf(err) == wire.ResourceLocked {
			break
		}
		if err == nil {
			t.Fatalf("a connection on %s used the exclusive queue of a connection on %s", b.addr, a.addr)
		}
		if wire.CodeOf(err) != wire.NotFound || time.Now().After(deadline) {
			t.Fatalf("passive declare of another node's exclusive queue: %v", err)
		}
		och, _ = other.Channel(ctx)       // the refusal closed the channel
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	other.Close()
	// Once a change made on b after the close is applied on a, so is
	// anything the close did: the exclusive queue is still there.
	_, sch := dial(b)
	if _, err := sch.DeclareQueue(ctx, "after-close", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := ch.DeclareQueue(ctx, "after-close", client.QueueOptions{Durable: true, Passive: true})
		if err == nil {
			break
		}
		if wire.CodeOf(err) != wire.NotFound || time.Now().After(deadline) {
			t.Fatalf("after-close on %s: %v", a.addr, err)
		}
		ch, _ = own.Channel(ctx)
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	if _, err := ch.DeclareQueue(ctx, "mine", client.QueueOptions{Passive: true}); err != nil {
		t.Fatalf("the exclusive queue after a connection on another node closed: %v", err)
	}
}

// transientAcrossNodes: a non-durable queue declared through node a lives
// there and is served from every node: published through b (confirmed),
// its count answered by a passive declare on b, consumed through c. An
// exclusive queue's consumer on another node is refused.
func transientAcrossNodes(t *testing.T, ctx context.Context, a, b, c *clusterChild) {
	t.Helper()
	dial := func(n *clusterChild) *client.Channel {
		t.Helper()
		conn, err := client.Dial(ctx, "warren://guest:guest@"+n.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		ch, err := conn.Channel(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	ach, bch, cch := dial(a), dial(b), dial(c)
	if _, err := ach.DeclareQueue(ctx, "transient", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ach.DeclareQueue(ctx, "xonly", client.QueueOptions{Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	// Once node b has xonly, it has transient (declared before).
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := bch.Consume(ctx, "xonly", client.ConsumeOptions{})
		if wire.CodeOf(err) == wire.ResourceLocked {
			break
		}
		if err == nil || wire.CodeOf(err) != wire.NotFound || time.Now().After(deadline) {
			t.Fatalf("a consumer on %s of an exclusive queue of a connection on %s: %v", b.addr, a.addr, err)
		}
		bch = dial(b)                     // the refusal closed the channel
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	bch = dial(b)
	for i := range 3 {
		if err := bch.Publish(ctx, "", client.Message{RoutingKey: "transient", Body: []byte(fmt.Sprint("t", i))}); err != nil {
			t.Fatalf("publish through %s: %v", b.addr, err)
		}
	}
	if info, err := bch.DeclareQueue(ctx, "transient", client.QueueOptions{Passive: true}); err != nil || info.Messages != 3 {
		t.Fatalf("passive declare on %s: %+v %v, want the home's 3 messages", b.addr, info, err)
	}
	cs, err := cch.Consume(ctx, "transient", client.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		select {
		case d := <-cs.Deliveries():
			if string(d.Body) != fmt.Sprint("t", i) {
				t.Fatalf("delivery %d through %s: %q", i, c.addr, d.Body)
			}
			if err := d.Ack(); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatalf("delivery %d through %s: none", i, c.addr)
		}
	}
}
