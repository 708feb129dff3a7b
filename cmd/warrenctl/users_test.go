package main

import (
	"context"
	"strings"
	"testing"

	"github.com/warren-mq/warren/client"
)

// warrenctl user add|list|set-password|set-tags|delete: the password comes
// on stdin (never on the command line, where ps shows it).
func TestWarrenctlUsers(t *testing.T) {
	c := newCtl(t, nil)
	c.ok("s3cret\n", "user", "add", "app", "--tags", "monitoring")
	if out := c.ok("", "user", "list"); !regexpLine(out, "app", "monitoring") {
		t.Fatalf("user list:\n%s", out)
	}
	addr := strings.TrimPrefix(c.url, "warren://guest:guest@")
	login := func(pass string) error {
		conn, err := client.Dial(context.Background(), "warren://app:"+pass+"@"+addr)
		if err == nil {
			conn.Close()
		}
		return err
	}
	// A user opens a vhost only with permissions there.
	if err := login("s3cret"); err == nil || !strings.Contains(err.Error(), "virtual host") {
		t.Fatalf("a user without permissions opened \"/\": %v", err)
	}
	c.ok("", "permission", "set", "app", "--configure", ".*", "--write", ".*", "--read", ".*")
	if err := login("s3cret"); err != nil {
		t.Fatalf("the new user cannot log in: %v", err)
	}
	c.ok("n3w\n", "user", "set-password", "app")
	if err := login("n3w"); login("s3cret") == nil || err != nil {
		t.Fatalf("set-password did not replace the password: %v", err)
	}
	c.ok("", "user", "set-tags", "app", "administrator", "monitoring")
	if out := c.ok("", "user", "list"); !regexpLine(out, "app", "administrator,monitoring") {
		t.Fatalf("set-tags:\n%s", out)
	}
	if err := login("n3w"); err != nil {
		t.Fatalf("set-tags changed the password: %v", err)
	}
	if _, errs, code := c.run("", "user", "add", "nopass"); code != 1 || !strings.Contains(errs, "password") {
		t.Fatalf("add without a password: exit %d %s", code, errs)
	}
	c.ok("", "user", "delete", "app")
	if out := c.ok("", "user", "list"); strings.Contains(out, "app") {
		t.Fatalf("deleted user listed:\n%s", out)
	}
}

// warrenctl permission set|list|clear over /api/permissions.
func TestWarrenctlPermissions(t *testing.T) {
	c := newCtl(t, nil)
	c.ok("pw\n", "user", "add", "app")
	c.ok("", "permission", "set", "app", "--configure", `^app\.`, "--write", `^app\.`, "--read", ".*")
	if out := c.ok("", "permission", "list"); !regexpLine(out, "/", "app", `^app\.`, ".*") {
		t.Fatalf("permission list:\n%s", out)
	}
	if _, errs, code := c.run("", "permission", "set", "app", "--configure", "("); code != 1 || !strings.Contains(errs, "configure") {
		t.Fatalf("bad regexp: exit %d %s", code, errs)
	}
	c.ok("", "permission", "clear", "app")
	if out := c.ok("", "permission", "list"); strings.Contains(out, "app") {
		t.Fatalf("cleared permission listed:\n%s", out)
	}
}
