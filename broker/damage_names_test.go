package broker

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-mq/warren/segment"
)

// walDamageNode writes a node's log in /data of mem with the durable
// queues q00..q(n-1) and a non-durable queue, their messages, and a flood
// of messages to q00 after them, then seals the WAL file that holds it
// all (a new one is started) and returns the sealed file's path.
func walDamageNode(t *testing.T, mem *segment.MemFS, n int) string {
	t.Helper()
	node := openDurNode(t, mem)
	k := newDurSink()
	var q0 *Queue
	for i := range n {
		q := declareDurable(t, node.b, fmt.Sprintf("q%02d", i), true)
		if i == 0 {
			q0 = q
		}
		batch := publish(node.b, q, k, true, "a")
		k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
	}
	declareDurable(t, node.b, "transient", false)
	for range 50 {
		batch := publish(node.b, q0, k, true, strings.Repeat("x", 512))
		k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
	}
	node.close(t)
	l := sealWAL(t, mem)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := mem.List("/data")
	var wals []string
	for _, name := range names {
		if strings.HasPrefix(name, "wal-") {
			wals = append(wals, "/data/"+name)
		}
	}
	if len(wals) < 2 {
		t.Fatalf("WAL files %v, want a sealed one and the active one", wals)
	}
	return wals[len(wals)-2]
}

// memState is every file of mem and its bytes.
func memState(t *testing.T, mem *segment.MemFS) map[string]string {
	t.Helper()
	names, _ := mem.List("/data")
	out := map[string]string{}
	for _, n := range names {
		f, err := mem.Open("/data/" + n)
		if err != nil {
			t.Fatal(err)
		}
		size, _ := f.Size()
		buf := make([]byte, size)
		_, _ = f.ReadAt(buf, 0)
		out[n] = string(buf)
	}
	return out
}

// TestNodeLogWALDamageNamesQueues: damage in a sealed WAL file quarantines
// the metadata group with every queue alive then; the node refuses to
// start, and its error names those durable queues (queues "q" in vhost "/", read from
// the metadata before the damage; at most 20, then how many more), not
// the non-durable one; reading them writes nothing to the log.
func TestNodeLogWALDamageNamesQueues(t *testing.T) {
	mem := segment.NewMemFS()
	wal := walDamageNode(t, mem, 23)
	mem.Corrupt(wal, mem.FileSize(wal)*3/4, 3)

	// A second start names them too.
	for range 2 {
		_, _, err := openNodeLog(mem, "/data", nil)
		if !errors.Is(err, segment.ErrCorrupt) || !strings.Contains(err.Error(), "metadata of this node is damaged") {
			t.Fatalf("open with a damaged sealed WAL file: %v", err)
		}
		msg := err.Error()
		var want []string
		for i := range 20 {
			want = append(want, fmt.Sprintf("%q", fmt.Sprintf("q%02d", i)))
		}
		if w := "queues " + strings.Join(want, ", ") + ` in vhost "/" and 3 more`; !strings.Contains(msg, w) {
			t.Fatalf("the error does not name queues q00 to q19 as %s: %v", w, err)
		}
		if strings.Contains(msg, "q20") || !strings.Contains(msg, "and 3 more") || strings.Contains(msg, "transient") {
			t.Fatalf("the error names more than 20 queues, or the non-durable one: %v", err)
		}
	}

	before := memState(t, mem)
	got := damagedQueueNames(mem, "/data", filepath.Base(wal), []uint64{QueueGroupBase + 1})
	if after := memState(t, mem); !maps.Equal(before, after) {
		t.Fatal("naming the queues wrote to the damaged log")
	}
	if !strings.Contains(got, `affected (from the metadata before the damage): queue "q`) || !strings.HasSuffix(got, `in vhost "/"`) {
		t.Fatalf("naming one group: %q", got)
	}
}

// TestNodeLogActiveWALDamageNamesQueues: damage in the active WAL file
// cannot be attributed; the error says so and names every durable queue
// of the metadata before the damage.
func TestNodeLogActiveWALDamageNamesQueues(t *testing.T) {
	mem := segment.NewMemFS()
	node := openDurNode(t, mem)
	k := newDurSink()
	q := declareDurable(t, node.b, "a", true)
	declareDurable(t, node.b, "b", true)
	for range 20 {
		batch := publish(node.b, q, k, true, strings.Repeat("x", 512))
		k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
	}
	node.close(t)
	names, _ := mem.List("/data")
	var wal string
	for _, n := range names {
		if strings.HasPrefix(n, "wal-") {
			wal = "/data/" + n
		}
	}
	mem.Corrupt(wal, mem.FileSize(wal)*3/4, 3)
	_, _, err := openNodeLog(mem, "/data", nil)
	if !errors.Is(err, segment.ErrUnattributable) || !strings.Contains(err.Error(), "cannot be attributed to queues") ||
		!strings.Contains(err.Error(), `queues "a", "b" in vhost "/"`) {
		t.Fatalf("open with a damaged active WAL file: %v", err)
	}
}
