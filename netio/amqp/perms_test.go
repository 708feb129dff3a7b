package amqp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio/amqp"
	"golang.org/x/crypto/bcrypt"
)

// The AMQP front applies the same permissions as the native protocol
// (issue 15 item 4): 403 ACCESS_REFUSED naming the permission and the
// resource.
func TestPermissionsOverAMQP(t *testing.T) {
	srv, l, _ := start(t, amqp.Config{})
	ctx := context.Background()
	h, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err := srv.Broker.PutUser(ctx, broker.MetaUser{Name: "app", PasswordHash: string(h)}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Broker.SetPermission(ctx, broker.MetaPermission{Vhost: "/", User: "app", Configure: `^app\.`, Write: `^app\.`, Read: `^app\.`}); err != nil {
		t.Fatal(err)
	}
	url := "amqp://app:pw@" + l.Addr().String() + "/"
	conn, ch := dial(t, url)
	if _, err := ch.QueueDeclare("app.q", false, false, false, false, nil); err != nil {
		t.Fatalf("declare within configure: %v", err)
	}
	refused := func(err error, what string) {
		t.Helper()
		if amqpCode(err) != 403 || !strings.Contains(err.Error(), what) {
			t.Fatalf("want 403 naming %q, got %v", what, err)
		}
	}
	_, err := ch.QueueDeclare("other", false, false, false, false, nil)
	refused(err, "configure")
	ch, _ = conn.Channel()
	_, err = ch.Consume("other", "", true, false, false, false, nil)
	refused(err, "read")
	ch, _ = conn.Channel()
	// The default exchange is amq.default: no write permission there. The
	// refusal closes the channel asynchronously: read it from NotifyClose
	// (a call made after the close arrived would only see 504).
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	if err := ch.Publish("", "app.q", false, false, amqp091.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-closed:
		if e == nil {
			t.Fatal("the channel closed without an error, want 403 naming \"write\"")
		}
		refused(e, "write")
	case <-time.After(10 * time.Second):
		t.Fatal("a publish without write permission did not close the channel")
	}
}
