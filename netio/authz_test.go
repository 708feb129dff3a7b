package netio_test

import (
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestNativeAuthorization (item 16): over the native protocol, deleting,
// purging and unbinding need the administrator tag or being the user who
// declared the resource; the refusal is access_refused and the channel
// stays open.
func TestNativeAuthorization(t *testing.T) {
	hash := func(pw string) string {
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		must(t, err)
		return string(h)
	}
	s := warrentest.StartServer(t, &netio.Config{Users: []netio.User{
		{Name: "alice", PasswordHash: hash("a")}, {Name: "bob", PasswordHash: hash("b")},
		{Name: "root", PasswordHash: hash("r"), Tags: []string{"administrator"}},
	}})
	ctx := ctxT(t)
	as := func(user, pw string) *client.Channel {
		c, err := client.Dial(ctx, "warren://"+user+":"+pw+"@"+s.Addr().String())
		must(t, err)
		t.Cleanup(func() { c.Close() })
		return channel(t, c)
	}
	alice, bob, root := as("alice", "a"), as("bob", "b"), as("root", "r")
	refused := func(what string, err error) {
		t.Helper()
		if wire.CodeOf(err) != wire.AccessRefused {
			t.Fatalf("%s: got %v, want access_refused", what, err)
		}
	}

	for _, q := range []string{"aq", "aq2"} {
		_, err := alice.DeclareQueue(ctx, q, client.QueueOptions{})
		must(t, err)
	}
	must(t, alice.DeclareExchange(ctx, "ax", "direct", client.ExchangeOptions{}))
	aBind := client.Binding{Source: "ax", Destination: "aq", RoutingKey: "k"}
	must(t, alice.Bind(ctx, aBind))

	// bob may not touch what alice declared…
	_, err := bob.DeleteQueue(ctx, "aq", false, false)
	refused("bob deletes alice's queue", err)
	_, err = bob.PurgeQueue(ctx, "aq")
	refused("bob purges alice's queue", err)
	refused("bob unbinds alice's binding", bob.Unbind(ctx, aBind))
	refused("bob deletes alice's exchange", bob.DeleteExchange(ctx, "ax", false))
	if _, ok := s.Queue("aq"); !ok {
		t.Fatal("alice's queue is gone")
	}
	// …but may do it to his own, and his channel is still open.
	_, err = bob.DeclareQueue(ctx, "bq", client.QueueOptions{})
	must(t, err)
	bBind := client.Binding{Source: "ax", Destination: "bq", RoutingKey: "k"}
	must(t, bob.Bind(ctx, bBind))
	must(t, bob.Unbind(ctx, bBind))
	_, err = bob.PurgeQueue(ctx, "bq")
	must(t, err)
	_, err = bob.DeleteQueue(ctx, "bq", false, false)
	must(t, err)

	// alice can do it to hers; an administrator to anyone's.
	_, err = alice.PurgeQueue(ctx, "aq")
	must(t, err)
	must(t, alice.Unbind(ctx, aBind))
	_, err = alice.DeleteQueue(ctx, "aq", false, false)
	must(t, err)
	_, err = root.PurgeQueue(ctx, "aq2")
	must(t, err)
	_, err = root.DeleteQueue(ctx, "aq2", false, false)
	must(t, err)
	must(t, root.DeleteExchange(ctx, "ax", false))
}
