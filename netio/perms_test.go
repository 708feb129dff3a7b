package netio_test

import (
	"strings"
	"testing"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
	"golang.org/x/crypto/bcrypt"
)

func refusedFor(err error, perm, resource string) bool {
	return wire.CodeOf(err) == wire.AccessRefused && strings.Contains(err.Error(), perm) && strings.Contains(err.Error(), resource)
}

// Permissions per user (issue 15 item 4), RabbitMQ's: configure governs
// declare and delete, write publish and the queue side of a bind, read
// consume, purge and the exchange side of a bind; they change at run time.
func TestPermissions(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	h, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	for _, u := range []string{"app", "nobody"} {
		if err := s.Broker.PutUser(ctx, broker.MetaUser{Name: u, PasswordHash: string(h)}); err != nil {
			t.Fatal(err)
		}
	}
	perm := broker.MetaPermission{Vhost: "/", User: "app", Configure: `^app\.`, Write: `^app\.`, Read: `^app\.(in|x)$`}
	if err := s.Broker.SetPermission(ctx, perm); err != nil {
		t.Fatal(err)
	}
	admin := channel(t, dial(t, s))
	if err := admin.DeclareExchange(ctx, "other", "direct", client.ExchangeOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.DeclareQueue(ctx, "other.q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	as := func(user string) *client.Channel {
		c, err := client.Dial(ctx, "warren://"+user+":pw@"+s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return channel(t, c)
	}
	app := as("app")
	if _, err := app.DeclareQueue(ctx, "app.in", client.QueueOptions{}); err != nil {
		t.Fatalf("declare within configure: %v", err)
	}
	if _, err := app.DeclareQueue(ctx, "mine", client.QueueOptions{}); !refusedFor(err, "configure", `queue "mine"`) {
		t.Fatalf("declare outside configure: %v", err)
	}
	if err := app.DeclareExchange(ctx, "app.x", "direct", client.ExchangeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := app.Bind(ctx, client.Binding{Source: "app.x", Destination: "app.in", RoutingKey: "k"}); err != nil {
		t.Fatalf("bind with write on the queue and read on the exchange: %v", err)
	}
	if err := app.Bind(ctx, client.Binding{Source: "other", Destination: "app.in", RoutingKey: "k"}); !refusedFor(err, "read", `exchange "other"`) {
		t.Fatalf("bind from an exchange without read: %v", err)
	}
	if err := app.Publish(ctx, "app.x", client.Message{RoutingKey: "k", Body: []byte("1")}); err != nil {
		t.Fatalf("publish with write: %v", err)
	}
	if err := app.Publish(ctx, "other", client.Message{RoutingKey: "k", Body: []byte("1")}); wire.CodeOf(err) != wire.AccessRefused {
		t.Fatalf("publish without write: %v", err)
	}
	if _, err := app.Consume(ctx, "other.q", client.ConsumeOptions{}); !refusedFor(err, "read", `queue "other.q"`) {
		t.Fatalf("consume without read: %v", err)
	}
	if _, err := app.PurgeQueue(ctx, "other.q"); !refusedFor(err, "read", `queue "other.q"`) {
		t.Fatalf("purge without read: %v", err)
	}
	if _, err := app.DeleteQueue(ctx, "other.q", false, false); !refusedFor(err, "configure", `queue "other.q"`) {
		t.Fatalf("delete without configure: %v", err)
	}
	if _, err := app.Consume(ctx, "app.in", client.ConsumeOptions{}); err != nil {
		t.Fatalf("consume with read: %v", err)
	}
	// A change applies at once, to open connections too (the publish
	// decision cached per connection is dropped).
	perm.Write = "^$"
	if err := s.Broker.SetPermission(ctx, perm); err != nil {
		t.Fatal(err)
	}
	if err := app.Publish(ctx, "app.x", client.Message{RoutingKey: "k", Body: []byte("2")}); wire.CodeOf(err) != wire.AccessRefused {
		t.Fatalf("publish after write was taken away: %v", err)
	}
	// A user without permissions in a vhost may not even open it
	// (RabbitMQ's first level of access control; vhosts_test.go).
	if _, err := client.Dial(ctx, "warren://nobody:pw@"+s.Addr().String()); wire.CodeOf(err) != wire.AuthFailed {
		t.Fatalf("a user without permissions opened \"/\": %v", err)
	}
}
