package main

import (
	"strings"
	"testing"

	"github.com/warren-mq/warren/netio"
)

// A user in --api is the admin API's login: it wins over --url's. With no
// user anywhere (a client-certificate login), an auth_failed says what the
// admin API needs.
func TestAPIUserWins(t *testing.T) {
	c := newCtl(t, nil)
	host := strings.TrimPrefix(c.api, "http://")
	wrong := &ctl{t: t, url: c.url, api: "http://guest:WRONG@" + host}
	if _, errs, code := wrong.run("", "queue", "list"); code != 1 || !strings.Contains(errs, "auth_failed") {
		t.Fatalf("--api with a wrong password: exit %d %q, want 1 and auth_failed", code, errs)
	}
	if strings.Contains(func() string { _, e, _ := wrong.run("", "queue", "list"); return e }(), "WRONG") {
		t.Error("the error shows the --api password")
	}
	right := &ctl{t: t, url: "warren://nobody:nothing@" + strings.TrimPrefix(c.url, "warren://guest:guest@"), api: "http://guest:guest@" + host}
	right.ok("", "queue", "list")
	// A broker without guest: the default login fails there as it does
	// for a client-certificate user away from the broker's host.
	ng := newCtl(t, &netio.Config{DisableGuest: true})
	noUser := &ctl{t: t, url: "warren://" + strings.TrimPrefix(ng.url, "warren://guest:guest@"), api: ng.api}
	_, errs, code := noUser.run("", "queue", "list")
	if code != 1 || !strings.Contains(errs, "auth_failed") || !strings.Contains(errs, "needs a password user") || !strings.Contains(errs, "--api https://USER:PASS@") {
		t.Fatalf("no user in --url or --api: exit %d %q, want 1 and a hint that the admin API needs a password user", code, errs)
	}
}
