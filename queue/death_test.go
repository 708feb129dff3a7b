package queue

import (
	"testing"

	"github.com/warren-mq/warren/wire"
)

func TestRecordDeath(t *testing.T) {
	var ds []wire.Death
	ds = RecordDeath(ds, "orders", wire.ReasonRejected, 100, "events", []string{"order.created"})
	ds = RecordDeath(ds, "retry", wire.ReasonExpired, 200, "dlx", []string{"orders"})
	ds = RecordDeath(ds, "orders", wire.ReasonRejected, 300, "events", []string{"order.created"})
	if len(ds) != 2 {
		t.Fatalf("want one entry per (queue, reason), got %+v", ds)
	}
	if d := ds[0]; d.Queue != "orders" || d.Count != 2 || d.FirstMs != 100 || d.LastMs != 300 {
		t.Fatalf("newest entry %+v", d)
	}
	if d := ds[1]; d.Queue != "retry" || d.Count != 1 || d.FirstMs != 200 {
		t.Fatalf("older entry %+v", d)
	}
	// The history survives the wire.
	raw := wire.AppendDeaths(nil, ds)
	back, err := wire.DecodeDeaths(raw)
	if err != nil || len(back) != 2 || back[0].Count != 2 || back[1].RoutingKeys[0] != "orders" {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
}

func TestDeadLetterCycle(t *testing.T) {
	expiredLoop := []wire.Death{
		{Queue: "b", Reason: wire.ReasonExpired},
		{Queue: "a", Reason: wire.ReasonExpired},
	}
	if !DeadLetterCycle(expiredLoop, "a") {
		t.Fatal("a → b → a by expiry alone is a cycle")
	}
	if DeadLetterCycle(expiredLoop, "c") {
		t.Fatal("c was never visited")
	}
	withReject := []wire.Death{
		{Queue: "b", Reason: wire.ReasonExpired},
		{Queue: "a", Reason: wire.ReasonRejected},
	}
	if DeadLetterCycle(withReject, "a") {
		t.Fatal("a consumer rejected in the loop: a retry loop, not a cycle")
	}
	if DeadLetterCycle(nil, "a") {
		t.Fatal("no history, no cycle")
	}
}
