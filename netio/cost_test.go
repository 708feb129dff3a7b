package netio

import (
	"testing"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// TestPublishCost reads the message count where the encoder writes it.
func TestPublishCost(t *testing.T) {
	b, mark := wire.BeginPublish(nil, 1, 7, []byte("ex"))
	for i := 0; i < 300; i++ {
		b = wire.AppendMessage(b, &wire.Message{RoutingKey: []byte("k")})
	}
	b = mark.End(b, 300)
	f, _, err := wire.Split(b, wire.HardMaxFrame)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := publishCost(f), int64(len(f.Payload))+300*(broker.StoredMsgOverhead+broker.PlacementOverhead); got != want {
		t.Fatalf("cost %d, want %d", got, want)
	}
}
