package netio

import (
	"context"
	"testing"

	"github.com/warren-mq/warren/broker"
	"golang.org/x/crypto/bcrypt"
)

// The publish path's permission decision is cached per connection per
// exchange: no allocation (and no regexp) per publish in steady state, and
// a change of permissions is seen at the next publish.
func TestPublishPermsCached(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	ctx := context.Background()
	h, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err := s.Broker.PutUser(ctx, broker.MetaUser{Name: "app", PasswordHash: string(h)}); err != nil {
		t.Fatal(err)
	}
	p := broker.MetaPermission{Vhost: "/", User: "app", Write: `^app\.`}
	if err := s.Broker.SetPermission(ctx, p); err != nil {
		t.Fatal(err)
	}
	var pp PublishPerms
	if !pp.Allowed(s, "app", "app.x") || pp.Allowed(s, "app", "other") || pp.Allowed(s, "app", "") {
		t.Fatal("wrong decisions")
	}
	ex := "app.x"
	if n := testing.AllocsPerRun(1000, func() { pp.Allowed(s, "app", ex) }); n != 0 {
		t.Fatalf("%v allocations per cached decision", n)
	}
	p.Write = `^other$`
	if err := s.Broker.SetPermission(ctx, p); err != nil {
		t.Fatal(err)
	}
	if pp.Allowed(s, "app", "app.x") || !pp.Allowed(s, "app", "other") {
		t.Fatal("a change of permissions was not seen")
	}
}

// In a vhost, a run of publish batches to one exchange resolves its
// internal name and its permission without allocating.
func TestVhostPublishPathAllocatesNothing(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	c := &conn{srv: s, vhost: "v"}
	ex := []byte("orders")
	var pp PublishPerms
	run := func() {
		local, internal := c.pubExchange(ex)
		if internal != "v\x1forders" || !pp.AllowedIn(s, "v", "guest", local) {
			t.Fatalf("pubExchange: %q %q", local, internal)
		}
	}
	run()
	if n := testing.AllocsPerRun(1000, run); n != 0 {
		t.Fatalf("%v allocations per batch", n)
	}
	if _, internal := c.pubExchange([]byte("other")); internal != "v\x1fother" {
		t.Fatalf("another exchange: %q", internal)
	}
}
