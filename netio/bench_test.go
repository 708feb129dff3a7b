package netio_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/internal/testcerts"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

// BenchmarkEndToEnd: broker and client in one process over loopback; one
// publisher (async, batching, confirm window 10,000) and one consumer
// (prefetch 1,000, acking every message, acks batched by the client) on a
// non-durable queue; 128-byte messages. Reports messages/s through the
// whole publish → confirm → deliver → ack cycle.
func BenchmarkEndToEnd(b *testing.B) { benchEndToEnd(b, false, 128) }

// BenchmarkEndToEndTLS: the same, plain and over TLS side by side (both
// clients on the TLS port; AES-128-GCM on a CPU with AES-NI), for 128-byte
// and 1 KiB messages: the cost of the TLS front (tls.go).
func BenchmarkEndToEndTLS(b *testing.B) {
	for _, size := range []int{128, 1024} {
		for _, overTLS := range []bool{false, true} {
			name := "plain"
			if overTLS {
				name = "tls"
			}
			b.Run(fmt.Sprintf("%s/%dB", name, size), func(b *testing.B) { benchEndToEnd(b, overTLS, size) })
		}
	}
}

func benchEndToEnd(b *testing.B, overTLS bool, size int) {
	url, opts := "", client.Options{}
	var s *netio.Server
	if overTLS {
		ca := testcerts.NewCA(b, "bench CA")
		s = warrentest.StartServer(b, &netio.Config{TLSAddr: "127.0.0.1:0",
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Server(b, "bench").TLS}}})
		url, opts.TLS = "warrens://guest:guest@"+s.TLSAddr().String(), &tls.Config{RootCAs: ca.Pool()}
	} else {
		s = warrentest.StartServer(b, nil)
		url = warrentest.URL(s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pc, err := client.Dial(ctx, url, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	cc, err := client.Dial(ctx, url, opts)
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
	body := make([]byte, size)
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
