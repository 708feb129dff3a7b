package netio_test

import (
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
	"golang.org/x/crypto/bcrypt"
)

// Virtual hosts on the native protocol (issue 15 item 3): the same queue
// name in two vhosts is two queues; a user without permissions in a vhost
// cannot open it; a vhost's max_connections holds; deleting a vhost
// deletes its resources and closes its connections.
func TestVhostsNative(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	addr := s.Addr().String()
	if err := s.Broker.PutVhost(ctx, broker.MetaVhost{Name: "v", MaxConnections: 2}); err != nil {
		t.Fatal(err)
	}
	h, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err := s.Broker.PutUser(ctx, broker.MetaUser{Name: "app", PasswordHash: string(h)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Broker.SetPermission(ctx, broker.MetaPermission{Vhost: "v", User: "app", Configure: ".*", Write: ".*", Read: ".*"}); err != nil {
		t.Fatal(err)
	}
	open := func(url string) (*client.Conn, error) {
		c, err := client.Dial(ctx, url)
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}
	root := channel(t, dial(t, s))
	appConn, err := open("warren://app:pw@" + addr + "/v")
	if err != nil {
		t.Fatalf("app opening v: %v", err)
	}
	app := channel(t, appConn)
	for _, ch := range []*client.Channel{root, app} {
		if _, err := ch.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Publish(ctx, "", client.Message{RoutingKey: "q", Body: []byte("in v")}); err != nil {
		t.Fatal(err)
	}
	if err := app.Publish(ctx, "amq.direct", client.Message{RoutingKey: "q"}); err != nil {
		t.Fatal(err) // v has its own amq.direct (unbound: unroutable, confirmed)
	}
	for _, c := range []struct {
		ch   *client.Channel
		want uint64
	}{{root, 0}, {app, 1}} {
		qi, err := c.ch.DeclareQueue(ctx, "q", client.QueueOptions{Passive: true})
		if err != nil || qi.Messages != c.want || qi.Name != "q" {
			t.Fatalf("queue q: %+v %v, want %d messages", qi, err, c.want)
		}
	}
	if v := metricValue(s, `warren_queue_ready{queue="q",vhost="v"}`); v != 1 {
		t.Fatalf(`warren_queue_ready{queue="q",vhost="v"} = %v, want 1`, v)
	}
	if v := metricValue(s, `warren_queue_ready{queue="q"}`); v != 0 {
		t.Fatalf(`warren_queue_ready{queue="q"} = %v, want 0`, v)
	}
	gen, err := app.DeclareQueue(ctx, "", client.QueueOptions{Exclusive: true})
	if err != nil || !strings.HasPrefix(gen.Name, "amq.gen-") {
		t.Fatalf("a generated name in v is answered as the client's: %+v %v", gen, err)
	}
	if _, err := root.DeclareQueue(ctx, gen.Name, client.QueueOptions{Passive: true}); wire.CodeOf(err) != wire.NotFound {
		t.Fatalf("v's generated queue seen from /: %v", err)
	}
	root = channel(t, dial(t, s)) // the refusal closed the channel

	if _, err := open("warren://app:pw@" + addr + "/"); wire.CodeOf(err) != wire.AuthFailed || !strings.Contains(err.Error(), `virtual host "/"`) {
		t.Fatalf("app opening / without permissions there: %v", err)
	}
	if _, err := open("warren://app:pw@" + addr + "/nope"); wire.CodeOf(err) != wire.AuthFailed {
		t.Fatalf("opening a vhost that does not exist: %v", err)
	}
	if _, err := open("warren://app:pw@" + addr + "/v"); err != nil {
		t.Fatal(err)
	}
	if _, err := open("warren://app:pw@" + addr + "/v"); wire.CodeOf(err) != wire.ResourceLimit {
		t.Fatalf("a third connection to v (max_connections 2): %v", err)
	}
	if n := s.VhostConnections("v"); n != 2 {
		t.Fatalf("v counts %d connections, want 2", n)
	}
	inV := 0
	for _, ci := range s.Connections() {
		if ci.Vhost == "v" {
			inV++
		}
	}
	if inV != 2 {
		t.Fatalf("Connections lists %d in v, want 2", inV)
	}

	if err := s.Broker.DeleteVhost(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-appConn.Done():
		if wire.CodeOf(appConn.Err()) != wire.ConnectionForced {
			t.Fatalf("v's connection closed with %v", appConn.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("v's connection outlived v")
	}
	if s.Broker.LookupQueue(broker.QualifyName("v", "q")) != nil || s.Broker.LookupQueue("q") == nil {
		t.Fatal("deleting v did not delete exactly v's queue q")
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.VhostConnections("v") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("v still counts %d connections", s.VhostConnections("v"))
		}
		<-s.Changed()
	}
}

// An alternate exchange and a dead-letter exchange need write on the
// target and read on what is declared, as RabbitMQ checks them; refusals
// are counted in warren_permission_refusals_total.
func TestAlternateAndDeadLetterPermissions(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	h, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err := s.Broker.PutUser(ctx, broker.MetaUser{Name: "app", PasswordHash: string(h)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Broker.SetPermission(ctx, broker.MetaPermission{Vhost: "/", User: "app", Configure: `^app\.`, Write: `^app\.`, Read: `^app\.`}); err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(ctx, "warren://app:pw@"+s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	before := metricValue(s, "warren_permission_refusals_total")
	app := channel(t, c)
	if err := app.DeclareExchange(ctx, "app.x", "direct", client.ExchangeOptions{AlternateExchange: "other.ae"}); !refusedFor(err, "write", `exchange "other.ae"`) {
		t.Fatalf("an alternate exchange without write on it: %v", err)
	}
	app = channel(t, c)
	dlx := wire.Table{{Key: "dead-letter-exchange", Value: wire.String("other.dlx")}}
	if _, err := app.DeclareQueue(ctx, "app.q", client.QueueOptions{Args: dlx}); !refusedFor(err, "write", `exchange "other.dlx"`) {
		t.Fatalf("a dead-letter exchange without write on it: %v", err)
	}
	app = channel(t, c)
	if err := app.DeclareExchange(ctx, "app.x", "direct", client.ExchangeOptions{AlternateExchange: "app.ae"}); err != nil {
		t.Fatal(err)
	}
	dlx[0].Value = wire.String("app.dlx")
	if _, err := app.DeclareQueue(ctx, "app.q", client.QueueOptions{Args: dlx}); err != nil {
		t.Fatal(err)
	}
	if got := metricValue(s, "warren_permission_refusals_total"); got != before+2 {
		t.Fatalf("warren_permission_refusals_total went from %v to %v, want +2", before, got)
	}
}
