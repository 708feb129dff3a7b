package client_test

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
)

// The SDK benchmarks run the client against an in-process broker
// (netio/warrentest) on loopback. ns/op, B/op and allocs/op are per message
// for the whole process (broker included: it is the same broker in every
// variant, so differences between variants are the client's). cpu-ns/msg
// is the process's user+system CPU over the timed part divided by the
// messages. Run them with
//
//	go test -run '^$' -bench SDK -benchtime 200000x -benchmem ./client
//
// With WARREN_SDK_BENCH_URL set (warren://guest:guest@127.0.0.1:5680, a
// warrend in another process) they run against that broker instead, and
// every figure, the CPU profile's too, is the client's alone.
func sdkSetup(b *testing.B) (context.Context, *client.Channel, *client.Channel) {
	url := os.Getenv("WARREN_SDK_BENCH_URL")
	if url == "" {
		url = warrentest.URL(warrentest.StartServer(b, nil))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	b.Cleanup(cancel)
	pc, err := client.Dial(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pc.Close() })
	cc, err := client.Dial(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	pub, err := pc.Channel(ctx)
	if err != nil {
		b.Fatal(err)
	}
	sub, err := cc.Channel(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pub.DeclareQueue(ctx, "sdk", client.QueueOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := pub.PurgeQueue(ctx, "sdk"); err != nil { // left by an earlier run on an outside broker
		b.Fatal(err)
	}
	return ctx, pub, sub
}

func cpuNanos() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// sdkClock is b's timer plus the process CPU time of the timed parts.
type sdkClock struct {
	b       *testing.B
	cpu, at int64
	t0      time.Time
	elapsed time.Duration
}

func (k *sdkClock) start() { k.b.StartTimer(); k.at, k.t0 = cpuNanos(), time.Now() }
func (k *sdkClock) stop() {
	k.cpu += cpuNanos() - k.at
	k.elapsed += time.Since(k.t0)
	k.b.StopTimer()
}

// sdkRun runs fn (which pauses the clock around untimed work) and
// reports CPU and rate per message.
func sdkRun(b *testing.B, fn func(k *sdkClock)) {
	b.ReportAllocs()
	b.ResetTimer()
	k := &sdkClock{b: b}
	k.start()
	fn(k)
	k.stop()
	b.ReportMetric(float64(k.cpu)/float64(b.N), "cpu-ns/msg")
	b.ReportMetric(float64(b.N)/k.elapsed.Seconds(), "msgs/s")
}

func publishN(b *testing.B, ctx context.Context, pub *client.Channel, n int) {
	body := make([]byte, 128)
	for i := 0; i < n; i++ {
		if _, err := pub.PublishAsync(ctx, "", client.Message{RoutingKey: "sdk", Body: body}); err != nil {
			b.Fatal(err)
		}
	}
	if err := pub.WaitConfirms(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSDKPublishConfirm: PublishAsync of 128-byte messages in a plain
// loop until every one is confirmed (no consumer).
//
// The queue is purged (untimed) every sdkRound messages: the broker
// stops publishers long before a few hundred thousand unconsumed
// messages, and that is not what this measures.
func BenchmarkSDKPublishConfirm(b *testing.B) {
	ctx, pub, _ := sdkSetup(b)
	sdkRun(b, func(k *sdkClock) {
		for done := 0; done < b.N; done += sdkRound {
			publishN(b, ctx, pub, min(sdkRound, b.N-done))
			k.stop()
			if _, err := pub.PurgeQueue(ctx, "sdk"); err != nil {
				b.Fatal(err)
			}
			k.start()
		}
	})
}

const sdkRound = 10000

// BenchmarkSDKConsumeAck: sdkRound messages at a time are queued
// (untimed), then a consumer (prefetch 1000) receives and acks each one
// on Deliveries() (the copying API).
func BenchmarkSDKConsumeAck(b *testing.B) {
	sdkConsume(b, func(ctx context.Context, sub *client.Channel, n int) *client.Consumer {
		cs, err := sub.Consume(ctx, "sdk", client.ConsumeOptions{Prefetch: 1000})
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < n; i++ {
			d := <-cs.Deliveries()
			d.Ack()
		}
		return cs
	})
}

// BenchmarkSDKConsumeBatchAck: the same with ConsumeBatch (bodies not
// copied), one Ack per delivery.
func BenchmarkSDKConsumeBatchAck(b *testing.B) {
	sdkConsume(b, func(ctx context.Context, sub *client.Channel, n int) *client.Consumer {
		got := make(chan struct{})
		seen := 0
		cs, err := sub.ConsumeBatch(ctx, "sdk", client.ConsumeOptions{Prefetch: 1000}, func(ds []client.Delivery) {
			for i := range ds {
				ds[i].Ack()
			}
			if seen += len(ds); seen == n {
				close(got)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		<-got
		return cs
	})
}

// sdkConsume queues sdkRound messages (untimed), then times consume, which
// starts a consumer, takes n messages and returns it (cancelled untimed).
func sdkConsume(b *testing.B, consume func(ctx context.Context, sub *client.Channel, n int) *client.Consumer) {
	ctx, pub, sub := sdkSetup(b)
	sdkRun(b, func(k *sdkClock) {
		for done := 0; done < b.N; done += sdkRound {
			n := min(sdkRound, b.N-done)
			k.stop()
			publishN(b, ctx, pub, n)
			k.start()
			cs := consume(ctx, sub, n)
			k.stop()
			if err := cs.Cancel(ctx); err != nil {
				b.Fatal(err)
			}
			k.start()
		}
	})
}

// BenchmarkSDKPublishConsumeAck and BenchmarkSDKPublishConsumeBatchAck:
// publish + confirm, consume + ack together, the figure of issue 17 item
// 3: one publisher (PublishAsync in a plain loop) and one consumer
// (prefetch 1000, one Ack per delivery) run at once on their own
// connections; the timer stops when every message is confirmed and
// consumed.
func BenchmarkSDKPublishConsumeAck(b *testing.B) {
	sdkPublishConsume(b, func(ctx context.Context, sub *client.Channel, got func(int)) {
		cs, err := sub.Consume(ctx, "sdk", client.ConsumeOptions{Prefetch: 1000})
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for d := range cs.Deliveries() {
				d.Ack()
				got(1)
			}
		}()
	})
}

func BenchmarkSDKPublishConsumeBatchAck(b *testing.B) {
	sdkPublishConsume(b, func(ctx context.Context, sub *client.Channel, got func(int)) {
		_, err := sub.ConsumeBatch(ctx, "sdk", client.ConsumeOptions{Prefetch: 1000}, func(ds []client.Delivery) {
			for i := range ds {
				ds[i].Ack()
			}
			got(len(ds))
		})
		if err != nil {
			b.Fatal(err)
		}
	})
}

// sdkPublishConsume starts the consumer (consume calls got with each
// number of messages taken), then times publishing b.N messages and
// taking them all.
func sdkPublishConsume(b *testing.B, consume func(ctx context.Context, sub *client.Channel, got func(int))) {
	ctx, pub, sub := sdkSetup(b)
	all := make(chan struct{})
	seen := 0 // on the consumer's goroutine only
	consume(ctx, sub, func(n int) {
		if seen += n; seen == b.N {
			close(all)
		}
	})
	sdkRun(b, func(k *sdkClock) {
		publishN(b, ctx, pub, b.N)
		<-all
	})
}
