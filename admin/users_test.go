package admin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/client"
)

// Users made at run time through the admin API log in over the native
// protocol; deleting one closes its connections; the list never shows a
// password or its hash; only an administrator may see or change them.
func TestUsersAtRunTime(t *testing.T) {
	e := setup(t)
	if st := e.do("PUT", "/api/users/app", `{"password":"s3cret","tags":["monitoring"]}`, nil); st != 204 && st != 200 && st != 201 {
		t.Fatalf("put user: %d", st)
	}
	var users []map[string]any
	if st := e.do("GET", "/api/users", "", &users); st != 200 {
		t.Fatalf("list: %d", st)
	}
	found := false
	for _, u := range users {
		if u["name"] == "app" {
			found = true
			if _, has := u["password_hash"]; has {
				t.Fatalf("the list shows a hash: %v", u)
			}
		}
	}
	if !found {
		t.Fatalf("app not listed: %v", users)
	}
	if st := e.doAs("viewer", "viewer-pw", "GET", "/api/users", "", nil); st != 403 {
		t.Fatalf("a non-administrator listed users: %d", st)
	}
	if st := e.doAs("viewer", "viewer-pw", "PUT", "/api/users/x", `{"password":"p"}`, nil); st != 403 {
		t.Fatalf("a non-administrator made a user: %d", st)
	}
	if st, name := e.errCode("PUT", "/api/users/y", `{"tags":[]}`); st != 400 || name != "invalid_argument" {
		t.Fatalf("no password: %d %s", st, name)
	}

	// Without permissions in "/" it could not open it (vhosts_test.go).
	if st := e.do("PUT", "/api/permissions/%2F/app", `{"configure":".*","write":".*","read":".*"}`, nil); st != 204 {
		t.Fatalf("put permissions: %d", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := "warren://app:s3cret@" + e.srv.Addr().String()
	c, err := client.Dial(ctx, url)
	if err != nil {
		t.Fatalf("the new user cannot log in: %v", err)
	}
	// A new password: the old one no longer works.
	if st := e.do("PUT", "/api/users/app", `{"password":"n3w"}`, nil); st >= 300 {
		t.Fatalf("set password: %d", st)
	}
	if _, err := client.Dial(ctx, url); err == nil || !strings.Contains(err.Error(), "auth") {
		t.Fatalf("the old password still logs in: %v", err)
	}
	if st := e.do("DELETE", "/api/users/app", "", nil); st != 204 {
		t.Fatalf("delete: %d", st)
	}
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("a deleted user's connection stays open")
	}
	if st, name := e.errCode("DELETE", "/api/users/app", ""); st != 404 || name != "not_found" {
		t.Fatalf("delete again: %d %s", st, name)
	}
}

// PUT/GET /api/permissions/{vhost}/{user}: the vhost is "/" (%2F) until
// virtual hosts exist; a bad regexp is refused naming it.
func TestPermissionsAPI(t *testing.T) {
	e := setup(t)
	e.do("PUT", "/api/users/app", `{"password":"pw"}`, nil)
	if st := e.do("PUT", "/api/permissions/%2F/app", `{"configure":"^app\\.","write":"^app\\.","read":".*"}`, nil); st != 204 {
		t.Fatalf("put: %d", st)
	}
	var ps []map[string]any
	// ps[0] is app's; viewer, a config-file user, got every permission
	// when it was created.
	if st := e.do("GET", "/api/permissions", "", &ps); st != 200 || len(ps) != 2 || ps[0]["user"] != "app" || ps[0]["vhost"] != "/" || ps[0]["configure"] != `^app\.` || ps[1]["user"] != "viewer" || ps[1]["write"] != ".*" {
		t.Fatalf("list: %d %v", st, ps)
	}
	if st, name := e.errCode("PUT", "/api/permissions/%2F/app", `{"configure":"(","write":"","read":""}`); st != 400 || name != "invalid_argument" {
		t.Fatalf("bad regexp: %d %s", st, name)
	}
	if st, name := e.errCode("PUT", "/api/permissions/%2F/ghost", `{"configure":"","write":"","read":""}`); st != 404 || name != "not_found" {
		t.Fatalf("unknown user: %d %s", st, name)
	}
	if st, _ := e.errCode("PUT", "/api/permissions/prod/app", `{"configure":"","write":"","read":""}`); st != 404 {
		t.Fatalf("unknown vhost: %d", st)
	}
	if st := e.do("DELETE", "/api/permissions/%2F/app", "", nil); st != 204 {
		t.Fatalf("delete: %d", st)
	}
}

// A password_hash that is not a bcrypt hash is refused, and the message
// names the command that makes one: warrend hash-password (warrenctl has
// no such command).
func TestUserPasswordHashRefusalNamesTheCommand(t *testing.T) {
	e := setup(t)
	var eb admin.ErrorBody
	if st := e.do("PUT", "/api/users/app", `{"password_hash":"$2a$10$..."}`, &eb); st != 400 || eb.Error.Name != "invalid_argument" {
		t.Fatalf("a bad password_hash: %d %+v", st, eb)
	}
	if !strings.Contains(eb.Error.Message, "warrend hash-password") || strings.Contains(eb.Error.Message, "warrenctl") {
		t.Fatalf("the refusal %q does not name warrend hash-password", eb.Error.Message)
	}
}
