package main

import (
	"strings"
	"testing"
)

// warrenctl vhost list|add|set-limits|delete over /api/vhosts.
func TestWarrenctlVhosts(t *testing.T) {
	c := newCtl(t, nil)
	c.ok("", "vhost", "add", "staging", "--max-queues", "5")
	if out := c.ok("", "vhost", "list"); !regexpLine(out, "/", "0", "-") || !regexpLine(out, "staging", "0", "5") {
		t.Fatalf("vhost list:\n%s", out)
	}
	c.ok("", "vhost", "set-limits", "staging", "--max-connections", "3")
	if out := c.ok("", "vhost", "list"); !regexpLine(out, "staging", "0", "-", "0", "3") {
		t.Fatalf("after set-limits:\n%s", out)
	}
	if _, errs, code := c.run("", "vhost", "set-limits", "nope"); code != 1 || !strings.Contains(errs, "nope") {
		t.Fatalf("set-limits of a vhost that does not exist: exit %d %s", code, errs)
	}
	c.ok("pw\n", "user", "add", "app")
	c.ok("", "permission", "set", "app", "--vhost", "staging", "--configure", ".*")
	if out := c.ok("", "permission", "list"); !regexpLine(out, "staging", "app") {
		t.Fatalf("permission in staging:\n%s", out)
	}
	c.ok("", "vhost", "delete", "staging")
	if out := c.ok("", "vhost", "list"); strings.Contains(out, "staging") {
		t.Fatalf("deleted vhost listed:\n%s", out)
	}
	if out := c.ok("", "permission", "list"); strings.Contains(out, "staging") {
		t.Fatalf("a deleted vhost's permissions listed:\n%s", out)
	}
	if _, errs, code := c.run("", "vhost", "delete", "/"); code != 1 || !strings.Contains(errs, "cannot be deleted") {
		t.Fatalf("deleting /: exit %d %s", code, errs)
	}
}

// --url's path names the vhost the resource commands work in: a queue
// declared, bound, published to, consumed from, listed and deleted in
// staging is staging's, and / never sees it.
func TestWarrenctlCommandsInVhost(t *testing.T) {
	c := newCtl(t, nil)
	c.ok("", "vhost", "add", "staging")
	st := &ctl{t: t, url: c.url + "/staging", api: c.api}
	st.ok("", "exchange", "declare", "ev", "--type", "direct")
	st.ok("", "queue", "declare", "jobs")
	st.ok("", "binding", "add", "--exchange", "ev", "--queue", "jobs", "--routing-key", "k")
	st.ok("", "publish", "--exchange", "ev", "--routing-key", "k", "hello")
	if out := st.ok("", "queue", "list"); !regexpLine(out, "jobs", "1") {
		t.Fatalf("queue list in staging:\n%s", out)
	}
	if out := c.ok("", "queue", "list"); strings.Contains(out, "jobs") {
		t.Fatalf("staging's queue listed in /:\n%s", out)
	}
	if _, errs, code := c.run("", "queue", "show", "jobs"); code != 1 || !strings.Contains(errs, "not_found") {
		t.Fatalf("staging's queue shown in /: exit %d %s", code, errs)
	}
	if out := st.ok("", "binding", "list"); !strings.Contains(out, "jobs") {
		t.Fatalf("binding list in staging:\n%s", out)
	}
	if out := st.ok("", "exchange", "list"); !strings.Contains(out, "ev") {
		t.Fatalf("exchange list in staging:\n%s", out)
	}
	if out := st.ok("", "consume", "jobs"); strings.TrimSpace(out) != "hello" {
		t.Fatalf("consume in staging: %q", out)
	}
	st.ok("", "queue", "delete", "jobs")
	if out := st.ok("", "queue", "list"); strings.Contains(out, "jobs") {
		t.Fatalf("deleted queue listed:\n%s", out)
	}
}
