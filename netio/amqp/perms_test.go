package amqp_test

import (
	"context"
	"strings"
	"testing"

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
	if err := ch.Publish("", "app.q", false, false, amqp091.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	// The default exchange is amq.default: no write permission there.
	_, err = ch.QueueDeclarePassive("app.q", false, false, false, false, nil)
	refused(err, "write")
}
