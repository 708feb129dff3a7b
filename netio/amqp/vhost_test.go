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

// connection.open's virtual-host is a Warren vhost (issue 15): the same
// queue name in two vhosts is two queues; a user without permissions in a
// vhost cannot open it (530 NOT_ALLOWED); deleting a vhost closes the
// connections to it (320 CONNECTION_FORCED).
func TestVhostsOverAMQP(t *testing.T) {
	srv, l, _ := start(t, amqp.Config{})
	ctx := context.Background()
	if err := srv.Broker.PutVhost(ctx, broker.MetaVhost{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	h, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err := srv.Broker.PutUser(ctx, broker.MetaUser{Name: "app", PasswordHash: string(h)}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Broker.SetPermission(ctx, broker.MetaPermission{Vhost: "v", User: "app", Configure: ".*", Write: ".*", Read: ".*"}); err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_, app := dial(t, "amqp://app:pw@"+addr+"/v")
	guestV, inV := dial(t, "amqp://guest:guest@"+addr+"/v")
	_, root := dial(t, "amqp://guest:guest@"+addr+"/")
	for _, ch := range []*amqp091.Channel{app, root} {
		if _, err := ch.QueueDeclare("q", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := app.PublishWithDeferredConfirmWithContext(ctx, "", "q", false, false, amqp091.Publishing{Body: []byte("in v")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publish in v not confirmed: %v %v", ok, err)
	}
	for _, c := range []struct {
		ch   *amqp091.Channel
		want int
	}{{root, 0}, {inV, 1}} {
		q, err := c.ch.QueueDeclarePassive("q", false, false, false, false, nil)
		if err != nil || q.Messages != c.want || q.Name != "q" {
			t.Fatalf("queue q: %+v %v, want %d messages", q, err, c.want)
		}
	}
	// amqp091-go reports a refused connection.open as its ErrVhost.
	if _, err := amqp091.Dial("amqp://app:pw@" + addr + "/"); err != amqp091.ErrVhost {
		t.Fatalf("app opening / without permissions there: %v", err)
	}

	closed := guestV.NotifyClose(make(chan *amqp091.Error, 1))
	if err := srv.Broker.DeleteVhost(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, closed, "a deleted vhost's connection")
	if srv.VhostConnections("v") != 0 {
		// The count drops once the socket is gone, just after the close.
		deadline := time.Now().Add(10 * time.Second)
		for srv.VhostConnections("v") != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // polling with a deadline: process-level
		}
		if n := srv.VhostConnections("v"); n != 0 {
			t.Fatalf("v still counts %d connections", n)
		}
	}
}
