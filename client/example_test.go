package client_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/wire"
)

// startBroker runs an in-process broker for the examples; a real
// application dials warren://user:pass@host:5680 instead.
func startBroker() (url string, stop func()) {
	s, err := netio.Start(netio.Config{Addr: "127.0.0.1:0"})
	if err != nil {
		log.Fatal(err)
	}
	return "warren://guest:guest@" + s.Addr().String(), func() { s.Close(context.Background()) }
}

// Publish with a confirm, consume, ack.
func Example() {
	url, stop := startBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	conn, err := client.Dial(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := ch.DeclareQueue(ctx, "greetings", client.QueueOptions{}); err != nil {
		log.Fatal(err)
	}
	// Publish waits for the broker's confirm.
	if err := ch.Publish(ctx, "", client.Message{RoutingKey: "greetings", Body: []byte("hello, warren")}); err != nil {
		log.Fatal(err)
	}
	cs, err := ch.Consume(ctx, "greetings", client.ConsumeOptions{Prefetch: 10})
	if err != nil {
		log.Fatal(err)
	}
	d := <-cs.Deliveries()
	fmt.Println(string(d.Body), "redelivered:", d.Redelivered)
	d.Ack()
	// Output: hello, warren redelivered: false
}

// A topic exchange, a binding, and a plain publishing loop that the client
// batches into large frames; confirms arrive asynchronously.
func ExampleChannel_PublishAsync() {
	url, stop := startBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _ := client.Dial(ctx, url)
	defer conn.Close()
	ch, _ := conn.Channel(ctx)

	ch.DeclareExchange(ctx, "events", "topic", client.ExchangeOptions{})
	ch.DeclareQueue(ctx, "orders", client.QueueOptions{})
	ch.Bind(ctx, client.Binding{Source: "events", Destination: "orders", RoutingKey: "order.*"})

	acked := 0
	ch.NotifyConfirm(func(first, last uint64, err error) {
		if err == nil {
			acked += int(last - first + 1) // runs on the reader goroutine, one call at a time
		}
	})
	for i := 0; i < 1000; i++ {
		ch.PublishAsync(ctx, "events", client.Message{RoutingKey: "order.created", Body: []byte(fmt.Sprint(i))})
	}
	if err := ch.WaitConfirms(ctx); err != nil {
		log.Fatal(err)
	}
	info, _ := ch.DeclareQueue(ctx, "orders", client.QueueOptions{Passive: true})
	fmt.Println("acked:", acked, "queued:", info.Messages)
	// Output: acked: 1000 queued: 1000
}

// Dead-lettering: a rejected message moves to the dead-letter exchange
// with its death history.
func ExampleDelivery_Reject() {
	url, stop := startBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _ := client.Dial(ctx, url)
	defer conn.Close()
	ch, _ := conn.Channel(ctx)

	ch.DeclareExchange(ctx, "dlx", "fanout", client.ExchangeOptions{})
	ch.DeclareQueue(ctx, "parking-lot", client.QueueOptions{})
	ch.Bind(ctx, client.Binding{Source: "dlx", Destination: "parking-lot"})
	ch.DeclareQueue(ctx, "work", client.QueueOptions{Args: wire.Table{
		{Key: "dead-letter-exchange", Value: wire.String("dlx")},
	}})
	ch.Publish(ctx, "", client.Message{RoutingKey: "work", Body: []byte("poison")})

	work, _ := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 1})
	(<-work.Deliveries()).Reject()

	dead, _ := ch.Consume(ctx, "parking-lot", client.ConsumeOptions{Prefetch: 1})
	d := <-dead.Deliveries()
	p, _ := d.Props()
	fmt.Println(string(d.Body), "died in", p.Deaths[0].Queue, "because", p.Deaths[0].Reason)
	d.Ack()
	// Output: poison died in work because rejected
}

// A session reconnects by itself and restores what it declared.
func ExampleConnect() {
	url, stop := startBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := client.Connect(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close()
	sess.DeclareQueue(ctx, "jobs", client.QueueOptions{})
	done := make(chan string, 1)
	sess.Consume(ctx, "jobs", client.ConsumeOptions{Prefetch: 100}, func(d *client.Delivery) {
		done <- string(d.Body)
		d.Ack()
	})
	sess.Publish(ctx, "", client.Message{RoutingKey: "jobs", Body: []byte("resize image 42")})
	fmt.Println(<-done)
	// Output: resize image 42
}

// A URL may name several nodes: the session fails over between them and
// declares its topology and restarts its consumers on the node it reaches.
func ExampleConnect_failover() {
	url1, stop1 := startBroker()
	url2, stop2 := startBroker()
	defer stop2()
	// warren://guest:guest@host1:port1,host2:port2 (the second URL's host
	// added to the first's list).
	url := url1 + "," + strings.TrimPrefix(url2, "warren://guest:guest@")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := client.Connect(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close()
	moved := make(chan struct{}, 1)
	sess.OnReconnect = func(int) { moved <- struct{}{} }
	sess.DeclareQueue(ctx, "jobs", client.QueueOptions{})
	done := make(chan string, 1)
	sess.Consume(ctx, "jobs", client.ConsumeOptions{Prefetch: 100}, func(d *client.Delivery) {
		done <- string(d.Body)
		d.Ack()
	})
	first := sess.Addr()
	stop1() // the first node goes away
	<-moved
	fmt.Println("moved to another node:", sess.Addr() != first)
	sess.Publish(ctx, "", client.Message{RoutingKey: "jobs", Body: []byte("resize image 43")})
	fmt.Println(<-done)
	// Output:
	// moved to another node: true
	// resize image 43
}
