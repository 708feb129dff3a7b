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
