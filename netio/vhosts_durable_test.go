package netio

import (
	"context"
	"testing"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// Vhosts, their limits, their durable queues and the permissions in them
// survive a restart with a data directory; a deleted vhost stays deleted.
func TestVhostsDurable(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Addr: "127.0.0.1:0", DataDir: dir}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, v := range []broker.MetaVhost{{Name: "v", MaxQueues: 7}, {Name: "gone"}} {
		if err := s.Broker.PutVhost(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Broker.PutUser(ctx, broker.MetaUser{Name: "app", PasswordHash: minHash(t, "pw")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Broker.SetPermission(ctx, broker.MetaPermission{Vhost: "v", User: "app", Read: ".*"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Broker.DeclareQueue(wire.QueueDeclare{Name: broker.QualifyName("v", "q"), Durable: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.Broker.DeleteVhost(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}

	s, err = Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(ctx) }()
	if v, ok := s.Broker.Vhost("v"); !ok || v.MaxQueues != 7 {
		t.Fatalf("vhost v after a restart: %+v %v", v, ok)
	}
	if _, ok := s.Broker.Vhost("gone"); ok {
		t.Fatal("a deleted vhost came back")
	}
	if s.Broker.LookupQueue(broker.QualifyName("v", "q")) == nil || s.Broker.VhostQueues("v") != 1 {
		t.Fatal("v's durable queue is gone after a restart")
	}
	if !s.hasVhostAccess("v", "app") || s.hasVhostAccess("/", "app") {
		t.Fatal("app's permissions in v did not survive the restart")
	}
	if _, err := s.OpenVhost("v", "app"); err != nil {
		t.Fatal(err)
	}
}
