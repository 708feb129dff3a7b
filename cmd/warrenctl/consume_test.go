package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/netio"
)

// peekCounts returns the bodies and delivery counts of the ready messages
// of a queue, through `queue get` (which delivers nothing).
func (c *ctl) peekCounts(name string) (bodies []string, counts []int) {
	c.t.Helper()
	var r struct {
		Messages []struct {
			Body          []byte
			DeliveryCount int `json:"delivery_count"`
		}
	}
	if err := json.Unmarshal([]byte(c.ok("", "--json", "queue", "get", name, "--count", "100")), &r); err != nil {
		c.t.Fatal(err)
	}
	for _, m := range r.Messages {
		bodies = append(bodies, string(m.Body))
		counts = append(counts, m.DeliveryCount)
	}
	return bodies, counts
}

// consume --count N takes exactly N messages: nothing more is delivered to
// it, so nothing comes back as a failed delivery (which a delivery-limit 1
// queue would dead-letter).
func TestConsumeTakesExactlyN(t *testing.T) {
	t.Parallel()
	c := newCtl(t, nil)
	c.ok("", "exchange", "declare", "dlx", "--type", "fanout")
	c.ok("", "queue", "declare", "dead")
	c.ok("", "binding", "add", "--exchange", "dlx", "--queue", "dead")
	c.ok("", "queue", "declare", "dl1", "--delivery-limit", "1", "--dlx", "dlx")
	c.ok("1\n2\n3\n4\n5\n6\n7\n8\n", "publish", "--routing-key", "dl1", "--lines")

	if out := c.ok("", "consume", "dl1", "--count", "1"); out != "1\n" {
		t.Fatalf("consume --count 1 printed %q", out)
	}
	if out := c.ok("", "consume", "dl1", "--count", "2"); out != "2\n3\n" {
		t.Fatalf("consume --count 2 printed %q", out)
	}
	// Peeks go through the queue's shard after the settlements, so the
	// counters read after them are settled too.
	if bodies, counts := c.peekCounts("dl1"); strings.Join(bodies, ",") != "4,5,6,7,8" || counts[0] != 0 {
		t.Fatalf("left in dl1: %v with delivery counts %v, want 4..8 never delivered", bodies, counts)
	}
	q := c.queueJSON("dl1")
	if q["delivered_total"] != 3.0 || q["redelivered_total"] != 0.0 || q["dead_lettered_total"] != 0.0 {
		t.Fatalf("after taking 1 and 2: delivered_total %v redelivered_total %v dead_lettered_total %v, want 3 0 0",
			q["delivered_total"], q["redelivered_total"], q["dead_lettered_total"])
	}

	// A peek with --requeue hands each message back once: one failed
	// delivery each, no more (a delivery-limit queue counts those).
	c.ok("", "queue", "declare", "dl3", "--delivery-limit", "3", "--dlx", "dlx")
	c.ok("1\n2\n3\n4\n5\n", "publish", "--routing-key", "dl3", "--lines")
	if out := c.ok("", "consume", "dl3", "--count", "3", "--requeue"); out != "1\n2\n3\n" {
		t.Fatalf("consume --count 3 --requeue printed %q", out)
	}
	bodies, counts := c.peekCounts("dl3")
	if strings.Join(bodies, ",") != "1,2,3,4,5" || fmt.Sprint(counts) != "[1 1 1 0 0]" {
		t.Fatalf("left in dl3: %v with delivery counts %v, want 1..5 with [1 1 1 0 0]", bodies, counts)
	}
	q = c.queueJSON("dl3")
	if q["delivered_total"] != 3.0 || q["redelivered_total"] != 0.0 || q["dead_lettered_total"] != 0.0 {
		t.Fatalf("after a --requeue peek of 3: delivered_total %v redelivered_total %v dead_lettered_total %v, want 3 0 0",
			q["delivered_total"], q["redelivered_total"], q["dead_lettered_total"])
	}
	if bodies, _ := c.peekCounts("dead"); len(bodies) != 0 {
		t.Fatalf("dead-lettered: %v", bodies)
	}
}

// A count above the broker's prefetch cap (1,000) is taken in windows,
// still exactly N.
func TestConsumeMoreThanThePrefetchCap(t *testing.T) {
	t.Parallel()
	c := newCtl(t, nil)
	c.ok("", "queue", "declare", "big")
	var in strings.Builder
	for i := 0; i < 1300; i++ {
		in.WriteString("m\n")
	}
	c.ok(in.String(), "publish", "--routing-key", "big", "--lines")
	out := c.ok("", "consume", "big", "--count", "1200", "--timeout", "3s")
	if n := strings.Count(out, "\n"); n != 1200 {
		t.Fatalf("printed %d lines, want 1200", n)
	}
	q := c.queueJSON("big")
	if q["delivered_total"] != 1200.0 || q["ready"] != 100.0 || q["redelivered_total"] != 0.0 {
		t.Fatalf("delivered_total %v ready %v redelivered_total %v, want 1200 100 0", q["delivered_total"], q["ready"], q["redelivered_total"])
	}
	if _, errs, code := c.run("", "consume", "big", "--count", "1001", "--requeue"); code != 2 || !strings.Contains(errs, "queue get") {
		t.Fatalf("--requeue over the window: exit %d %q", code, errs)
	}
}

// lineCounter calls fn once it has seen n lines.
type lineCounter struct {
	n  int
	fn func()
}

func (w *lineCounter) Write(p []byte) (int, error) {
	for _, b := range p {
		if b == '\n' {
			if w.n--; w.n == 0 {
				w.fn()
			}
		}
	}
	return len(p), nil
}

// An interrupt (SIGINT) while consume waits for more: it returns at once,
// and the messages it printed are acked, not handed back.
func TestConsumeInterrupted(t *testing.T) {
	t.Parallel()
	c := newCtl(t, nil)
	c.ok("", "queue", "declare", "q")
	c.ok("1\n2\n", "publish", "--routing-key", "q", "--lines")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--url", c.url, "--api", c.api, "consume", "q", "--count", "5", "--timeout", "1h"},
			func(string) string { return "" }, strings.NewReader(""), &lineCounter{n: 2, fn: cancel}, io.Discard)
	}()
	select {
	case code := <-done:
		if code != 1 {
			t.Fatalf("interrupted consume: exit %d, want 1", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("consume did not return after the interrupt")
	}
	// The peek goes through the queue's shard after the acks: then the
	// counters are settled too.
	if bodies, _ := c.peekCounts("q"); len(bodies) != 0 {
		t.Fatalf("after the interrupt the queue holds %v", bodies)
	}
	if q := c.queueJSON("q"); q["acked_total"] != 2.0 || q["ready"] != 0.0 {
		t.Fatalf("after the interrupt: acked_total %v ready %v, want 2 0", q["acked_total"], q["ready"])
	}
}

// On a broker whose prefetch cap is below the window, --window takes all
// N; without it, consume stops at the timeout and says why it may have.
func TestConsumeWindowBelowABrokersCap(t *testing.T) {
	t.Parallel()
	c := newCtl(t, &netio.Config{MaxPrefetch: 5})
	c.ok("", "queue", "declare", "q")
	c.ok("1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n", "publish", "--routing-key", "q", "--lines")
	if out := c.ok("", "consume", "q", "--count", "7", "--window", "5"); out != "1\n2\n3\n4\n5\n6\n7\n" {
		t.Fatalf("consume --count 7 --window 5 printed %q", out)
	}
	out, errs, code := c.run("", "consume", "q", "--count", "6", "--timeout", "300ms")
	if code != 1 || out != "8\n9\n10\n11\n12\n" || !strings.Contains(errs, "got 5 of 6") || !strings.Contains(errs, "--window") {
		t.Fatalf("consume over a lower cap: exit %d, printed %q, %q", code, out, errs)
	}
}
