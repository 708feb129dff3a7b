package amqp_test

import (
	"context"
	"testing"
	"time"

	"github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio/amqp"
	"golang.org/x/crypto/bcrypt"
)

// A user deleted at run time loses its AMQP connections (320
// CONNECTION_FORCED), as it loses its native ones (issue 15).
func TestDeletedUserLosesAMQPConnections(t *testing.T) {
	srv, l, _ := start(t, amqp.Config{})
	ctx := context.Background()
	h, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err := srv.Broker.PutUser(ctx, broker.MetaUser{Name: "app", PasswordHash: string(h)}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Broker.SetPermission(ctx, broker.MetaPermission{Vhost: "/", User: "app", Configure: ".*", Write: ".*", Read: ".*"}); err != nil {
		t.Fatal(err)
	}
	conn, _ := dial(t, "amqp://app:pw@"+l.Addr().String()+"/")
	closed := conn.NotifyClose(make(chan *amqp091.Error, 1))
	if err := srv.Broker.DeleteUser(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, closed, "a deleted user's AMQP connection")
}

func waitClosed(t *testing.T, closed chan *amqp091.Error, what string) {
	t.Helper()
	select {
	case e := <-closed:
		if e == nil || e.Code != 320 {
			t.Fatalf("%s closed with %v, want 320 CONNECTION_FORCED", what, e)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s stays open", what)
	}
}
