package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// Command-line handling as a new user meets it.
func TestCommandLine(t *testing.T) {
	t.Parallel()
	c := newCtl(t, nil)
	c.ok("", "queue", "declare", "orders", "--max-length", "10")

	// Global flags work after the command too.
	var qs []map[string]any
	if out := c.ok("", "queue", "list", "--json"); json.Unmarshal([]byte(out), &qs) != nil || len(qs) != 1 || qs[0]["name"] != "orders" {
		t.Errorf("queue list --json printed %q", out)
	}
	// Unknown flags and stray arguments are usage errors (exit 2, with usage).
	for _, args := range [][]string{
		{"queue", "list", "--bogus"},
		{"queue", "show", "orders", "--bogus"},
		{"queue", "show", "--bogus"},
		{"exchange", "list", "extra"},
		{"consume", "orders", "--cuont", "1"},
		{"--bogus", "status"},
	} {
		if _, errs, code := c.run("", args...); code != 2 || !strings.Contains(errs, "usage:") {
			t.Errorf("warrenctl %v: exit %d, stderr %q; want exit 2 with usage", args, code, errs)
		}
	}
	if _, errs, code := c.run(""); code != 2 || !strings.Contains(errs, "Commands:") {
		t.Errorf("warrenctl with no arguments: exit %d, stderr %q; want exit 2 with usage", code, errs)
	}
	if out, _, code := c.run("", "help"); code != 0 || !strings.Contains(out, "Commands:") {
		t.Errorf("warrenctl help: exit %d, stdout %q", code, out)
	}

	// queue show prints lines a person reads, not a Go map.
	if out := c.ok("", "queue", "show", "orders"); strings.Contains(out, "map[") || !regexpLine(out, "rates.publish", "0/s") || !regexpLine(out, "max_length", "10") {
		t.Errorf("queue show:\n%s", out)
	}
	if out := c.ok("", "status"); strings.Contains(out, "map[") {
		t.Errorf("status:\n%s", out)
	}

	// binding add and delete say what they did.
	c.ok("", "exchange", "declare", "events", "--type", "topic")
	if _, errs, _ := c.run("", "binding", "add", "--exchange", "events", "--queue", "orders", "--routing-key", "order.*"); !strings.Contains(errs, `"events"`) || !strings.Contains(errs, `"orders"`) || !strings.Contains(errs, `"order.*"`) {
		t.Errorf("binding add said %q", errs)
	}
	if _, errs, _ := c.run("", "binding", "delete", "--exchange", "events", "--queue", "orders", "--routing-key", "order.*"); !strings.Contains(errs, "deleted") {
		t.Errorf("binding delete said %q", errs)
	}

	// A publish that reaches no queue is a failure, not "all confirmed".
	_, errs, code := c.run("", "publish", "--routing-key", "ordres", "x")
	if code != 1 || strings.Contains(errs, "all confirmed") || !strings.Contains(errs, `no queue "ordres"`) {
		t.Errorf("publish to a missing queue: exit %d, stderr %q", code, errs)
	}
	_, errs, code = c.run("", "publish", "--exchange", "events", "--routing-key", "nothing.bound", "x")
	if code != 1 || strings.Contains(errs, "all confirmed") || !strings.Contains(errs, "matched no binding") {
		t.Errorf("publish matching no binding: exit %d, stderr %q", code, errs)
	}
	if ready := c.queueJSON("orders")["ready"]; ready != 0.0 {
		t.Errorf("orders has %v ready messages, want 0", ready)
	}
}

// A publish to a missing exchange names it and says to declare it, once.
func TestPublishToMissingExchange(t *testing.T) {
	t.Parallel()
	c := newCtl(t, nil)
	_, errs, code := c.run("", "publish", "--exchange", "events", "--routing-key", "k", "x")
	if code != 1 || !strings.Contains(errs, `exchange "events"`) || strings.Contains(errs, "nack: exchange_not_found") || !strings.Contains(errs, "warrenctl exchange declare events") {
		t.Fatalf("publish to a missing exchange: exit %d %q", code, errs)
	}
}

// publish to the default exchange needs --routing-key (the queue it names):
// without one it is a usage error saying so (exit 2, nothing sent), not a
// publish to the queue "" with the advice to declare a queue named "".
func TestPublishWithoutRoutingKey(t *testing.T) {
	t.Parallel()
	c := newCtl(t, nil)
	_, errs, code := c.run("", "publish", "hi")
	if code != 2 || !strings.Contains(errs, "--routing-key") || strings.Contains(errs, "queue declare )") {
		t.Fatalf("publish without --routing-key: exit %d %q", code, errs)
	}
	// To an exchange, an empty routing key is a routing key like any other.
	c.ok("", "exchange", "declare", "all", "--type", "fanout")
	c.ok("", "queue", "declare", "q")
	c.ok("", "binding", "add", "--exchange", "all", "--queue", "q", "--routing-key", "")
	c.ok("", "publish", "--exchange", "all", "hi")
	if ready := c.queueJSON("q")["ready"]; ready != 1.0 {
		t.Errorf("q has %v ready messages, want 1", ready)
	}
}
