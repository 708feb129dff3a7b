package netio

import (
	"context"
	"testing"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/wire"
	"golang.org/x/crypto/bcrypt"
)

// A user deleted while its connection is being opened (OPEN_OK queued,
// the connection not yet marked open) does not keep that connection: the
// scan that closes a deleted user's connections skips one not open yet,
// and the connection now looks the user up once it is open. Before, it
// stayed open for good (TestUsersAtRunTime in admin saw it in CI).
func TestUserDeletedWhileOpening(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err := s.Broker.PutUser(ctx, broker.MetaUser{Name: "app", PasswordHash: string(h)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Broker.SetPermission(ctx, broker.MetaPermission{Vhost: "/", User: "app", Configure: ".*", Write: ".*", Read: ".*"}); err != nil {
		t.Fatal(err)
	}
	scanned := make(chan struct{}, 1)
	s.OnUserDeleted(func(string) { scanned <- struct{}{} }) // closeUsers' scan is over
	hook := func(user string) {
		if user != "app" {
			return
		}
		if err := s.Broker.DeleteUser(ctx, "app"); err != nil {
			t.Error(err)
			return
		}
		select {
		case <-scanned:
		case <-ctx.Done():
		}
	}
	s.beforeOpen.Store(&hook)
	c, err := client.Dial(ctx, "warren://app:pw@"+s.Addr().String())
	if err != nil {
		// Refused outright is fine too (CLOSE before OPEN_OK reached it).
		if wire.CodeOf(err) != wire.ConnectionForced {
			t.Fatalf("dial: %v", err)
		}
		return
	}
	defer c.Close()
	select {
	case <-c.Done():
		if wire.CodeOf(c.Err()) != wire.ConnectionForced {
			t.Fatalf("closed with %v, want connection_forced", c.Err())
		}
	case <-ctx.Done():
		t.Fatal("a user deleted while its connection was opening kept it")
	}
}
