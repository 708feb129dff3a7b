package amqp

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio"
	"golang.org/x/crypto/bcrypt"
)

// A user deleted while its AMQP connection is being opened (the vhost
// admitted, the connection not yet marked open) does not keep that
// connection: the scan closing a deleted user's connections skips one not
// open yet, and the connection now looks the user up once it is open.
// Before, it stayed open for good (the native front had the same race,
// netio's TestUserDeletedWhileOpening).
func TestUserDeletedWhileOpeningAMQP(t *testing.T) {
	srv, err := netio.Start(netio.Config{Addr: "127.0.0.1:0", Shards: 1, EventLoops: 1})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(srv, Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	defer func() {
		_ = l.Close()
		_ = srv.Close(ctx)
	}()
	h, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err := srv.Broker.PutUser(ctx, broker.MetaUser{Name: "app", PasswordHash: string(h)}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Broker.SetPermission(ctx, broker.MetaPermission{Vhost: "/", User: "app", Configure: ".*", Write: ".*", Read: ".*"}); err != nil {
		t.Fatal(err)
	}
	scanned := make(chan struct{}, 1)
	srv.OnUserDeleted(func(string) { scanned <- struct{}{} }) // after the listener's own scan
	hook := func(user string) {
		if err := srv.Broker.DeleteUser(ctx, user); err != nil {
			t.Error(err)
			return
		}
		select {
		case <-scanned:
		case <-ctx.Done():
		}
	}
	l.beforeOpen.Store(&hook)
	conn, err := amqp091.Dial("amqp://app:pw@" + l.Addr().String() + "/")
	if err != nil {
		// Closed during connection.open: amqp091-go reports any close
		// there as its ErrVhost ("no access to this vhost").
		return
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp091.Error, 1))
	select {
	case e := <-closed:
		if e == nil || e.Code != connectionForced {
			t.Fatalf("closed with %v, want 320 CONNECTION_FORCED", e)
		}
	case <-ctx.Done():
		t.Fatal("a user deleted while its AMQP connection was opening kept it")
	}
}
