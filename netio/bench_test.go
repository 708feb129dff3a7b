package netio_test

import (
	"context"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
)

// BenchmarkEndToEnd: broker and client in one process over loopback; one
// publisher (async, batching, confirm window 10,000) and one consumer
// (prefetch 1,000, acking every message, acks batched by the client) on a
// non-durable queue; 128-byte messages. Reports messages/s through the
// whole publish → confirm → deliver → ack cycle.
func BenchmarkEndToEnd(b *testing.B) {
	s := warrentest.StartServer(b, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pc, err := client.Dial(ctx, warrentest.URL(s))
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	cc, err := client.Dial(ctx, warrentest.URL(s))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	pub, _ := pc.Channel(ctx)
	sub, _ := cc.Channel(ctx)
	if _, err := pub.DeclareQueue(ctx, "bench", client.QueueOptions{}); err != nil {
		b.Fatal(err)
	}
	cs, err := sub.Consume(ctx, "bench", client.ConsumeOptions{Prefetch: 1000})
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 128)
	done := make(chan struct{})
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	go func() {
		for i := 0; i < b.N; i++ {
			d := <-cs.Deliveries()
			d.Ack()
		}
		close(done)
	}()
	for i := 0; i < b.N; i++ {
		if _, err := pub.PublishAsync(ctx, "", client.Message{RoutingKey: "bench", Body: body}); err != nil {
			b.Fatal(err)
		}
	}
	if err := pub.WaitConfirms(ctx); err != nil {
		b.Fatal(err)
	}
	<-done
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
