package netio

import (
	"context"
	"testing"

	"github.com/warren-mq/warren/broker"
	"golang.org/x/crypto/bcrypt"
)

func minHash(t *testing.T, pass string) string {
	h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// Users changed at run time are durable with a data directory, and win
// over the config file's bootstrap users at the next start.
func TestUsersDurableAndBootstrap(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Addr: "127.0.0.1:0", DataDir: dir, DisableGuest: true,
		Users: []User{{Name: "boot", PasswordHash: minHash(t, "boot-pw"), Tags: []string{"administrator"}}}}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, ok := s.Authenticate("boot", "boot-pw", "127.0.0.1:1"); !ok {
		t.Fatal("the config file's user cannot log in")
	}
	if err := s.Broker.PutUser(ctx, broker.MetaUser{Name: "app", PasswordHash: minHash(t, "app-pw")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Broker.PutUser(ctx, broker.MetaUser{Name: "boot", PasswordHash: minHash(t, "changed"), Tags: []string{"administrator"}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Authenticate("boot", "boot-pw", "127.0.0.1:1"); ok {
		t.Fatal("the old password still works after a change")
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}

	s, err = Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(ctx) }()
	if _, ok := s.Authenticate("app", "app-pw", "127.0.0.1:1"); !ok {
		t.Fatal("a user made at run time is gone after a restart")
	}
	if _, ok := s.Authenticate("boot", "changed", "127.0.0.1:1"); !ok {
		t.Fatal("the run-time password of a config-file user did not survive the restart")
	}
	if _, ok := s.Authenticate("boot", "boot-pw", "127.0.0.1:1"); ok {
		t.Fatal("the config file's password came back over the run-time change")
	}
	if !s.IsAdmin("boot") || s.IsAdmin("app") {
		t.Fatal("tags lost")
	}
}
