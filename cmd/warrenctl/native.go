package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/wire"
)

// ---- native protocol ----

func (c *cli) dial() (*client.Conn, *client.Channel, error) {
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, c.url, client.Options{Name: "warrenctl", TLS: c.tlsCfg})
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %s", redact(c.url), protoErr(err))
	}
	ch, err := conn.Channel(ctx)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return u
	}
	p.User = url.User(p.User.Username())
	return p.String()
}

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ",") }
func (h *headerFlags) Set(s string) error { *h = append(*h, s); return nil }

func (c *cli) publish(args []string) error {
	fs := flags("publish")
	ex := fs.String("exchange", "", "")
	key := fs.String("routing-key", "", "")
	persistent := fs.Bool("persistent", false, "")
	mandatory := fs.Bool("mandatory", true, "")
	prio := fs.Uint("priority", 0, "")
	ctype := fs.String("content-type", "", "")
	msgID := fs.String("message-id", "", "")
	lines := fs.Bool("lines", false, "")
	file := fs.String("file", "", "")
	raw := fs.Bool("raw", false, "")
	var hdrs headerFlags
	fs.Var(&hdrs, "header", "")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *prio > 255 {
		return usageErr{"publish: --priority must be 0-255"}
	}
	if *raw && *lines {
		return usageErr{"publish: --raw and --lines exclude each other (--lines takes each line without its newline)"}
	}
	if *ex == "" && *key == "" {
		return usageErr{"publish: --routing-key is needed with the default exchange: it names the queue the message goes to (or publish to an exchange with --exchange EX)"}
	}
	var props *wire.Props
	if *ctype != "" || *msgID != "" || len(hdrs) > 0 {
		props = &wire.Props{ContentType: *ctype, MessageID: *msgID}
		for _, h := range hdrs {
			k, v, ok := strings.Cut(h, "=")
			if !ok {
				return usageErr{"publish: --header wants key=value"}
			}
			props.Headers = append(props.Headers, wire.Field{Key: k, Value: wire.String(v)})
		}
	}
	var bodies [][]byte
	switch {
	case len(pos) > 1:
		return usageErr{"publish: at most one BODY argument (use --lines for many messages)"}
	case len(pos) == 1:
		if *raw {
			return usageErr{"publish: --raw is for a body read from stdin or --file (a BODY argument is published as given)"}
		}
		bodies = [][]byte{[]byte(pos[0])}
	default:
		var r io.Reader = c.stdin
		if *file != "" {
			f, err := os.Open(*file)
			if err != nil {
				return err
			}
			defer f.Close()
			r = f
		}
		if *lines {
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 64<<20)
			for sc.Scan() {
				bodies = append(bodies, append([]byte(nil), sc.Bytes()...))
			}
			if err := sc.Err(); err != nil {
				return err
			}
		} else {
			b, err := io.ReadAll(r)
			if err != nil {
				return err
			}
			if !*raw {
				// `echo hello | warrenctl publish` publishes "hello", as
				// the BODY argument would: one trailing newline (\n or
				// \r\n) goes.
				if t, ok := bytes.CutSuffix(b, []byte("\n")); ok {
					b = bytes.TrimSuffix(t, []byte("\r"))
				}
			}
			bodies = [][]byte{b}
		}
	}
	conn, ch, err := c.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	var returned atomic.Int64
	var returnCode atomic.Uint32
	ch.NotifyReturn(func(r client.Return) {
		returned.Add(1)
		returnCode.Store(uint32(r.Code))
	})
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	defer cancel()
	var ms []client.Message
	for _, b := range bodies {
		ms = append(ms, client.Message{RoutingKey: *key, Body: b, Persistent: *persistent, Mandatory: *mandatory, Priority: uint8(*prio), Props: props})
	}
	if err := ch.PublishBatch(ctx, *ex, ms); err != nil {
		var we *wire.Error
		if errors.As(err, &we) && we.Code == wire.ExchangeNotFound {
			return fmt.Errorf("publish: %s (warrenctl exchange declare %s --type TYPE)", protoErr(err), *ex)
		}
		if errors.As(err, &we) && we.Code == wire.AccessRefused {
			// A nack carries no text: say what permission it needs.
			name := *ex
			if name == "" {
				name = "amq.default" // the default exchange's name in permissions
			}
			return fmt.Errorf("publish: %s (publishing needs write permission on exchange %q in vhost %q: warrenctl permission set USER --vhost %s --write ...)", protoErr(err), name, c.vhost, c.vhost)
		}
		return fmt.Errorf("publish: %s", protoErr(err))
	}
	n := returned.Load()
	if n == 0 {
		fmt.Fprintf(c.errw, "published %d message(s), all confirmed\n", len(ms))
		return nil
	}
	// RETURNs come before the confirms of the same messages (spec §8.3).
	what := fmt.Sprintf("%d of %d message(s) reached no queue and were not stored", n, len(ms))
	switch {
	case wire.Code(returnCode.Load()) != wire.NoRoute:
		return fmt.Errorf("%s: %s", what, wire.Code(returnCode.Load()))
	case *ex == "":
		return fmt.Errorf("%s: no queue %q (the default exchange delivers to the queue named by the routing key; declare it with: warrenctl queue declare %s)", what, *key, *key)
	default:
		return fmt.Errorf("%s: exchange %q matched no binding for routing key %q (add one with: warrenctl binding add --exchange %s --queue QUEUE --routing-key KEY)", what, *ex, *key, *ex)
	}
}

// protoErr prints a protocol error as "code: reason", without the Go
// package prefix.
func protoErr(err error) string {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code.String() + ": " + we.Reason
	}
	return err.Error()
}

// consumeWindow is the most deliveries consume asks for at once by
// default (--window): the broker's default cap on a consumer's prefetch
// (Config.MaxPrefetch). A broker configured with a lower cap delivers
// fewer per window, and a count above that cap then stops at the
// --timeout unless --window is set to the cap.
const consumeWindow = 1000

// consume takes exactly count messages. It never lets the broker push a
// message it does not want: each window subscribes with a prefetch of what
// is still wanted (at most consumeWindow) and settles nothing until the
// window is full, so the broker cannot send more; then it cancels the
// consumer and only then settles. A message delivered and then taken back
// on close would count as a failed delivery (and a delivery-limit queue
// dead-letters those).
func (c *cli) consume(args []string) error {
	fs := flags("consume")
	count := fs.Int("count", 1, "")
	requeue := fs.Bool("requeue", false, "")
	reject := fs.Bool("reject", false, "")
	timeout := fs.Duration("timeout", 5*time.Second, "")
	window := fs.Int("window", consumeWindow, "")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	name, err := oneOf("consume", pos)
	if err != nil {
		return err
	}
	switch {
	case *requeue && *reject:
		return usageErr{"consume: --requeue and --reject exclude each other"}
	case *count < 1:
		return usageErr{"consume: --count must be at least 1"}
	case *window < 1:
		return usageErr{"consume: --window must be at least 1"}
	case *requeue && *count > *window:
		// Requeued messages go back to the head of the queue: a second
		// window would take the same ones again.
		return usageErr{fmt.Sprintf("consume: --requeue takes at most --window (%d) messages; to look at more without taking them, use queue get", *window)}
	case *timeout <= 0:
		return usageErr{"consume: --timeout must be positive"}
	}
	conn, ch, err := c.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	got := 0
	for got < *count {
		want := min(*count-got, *window)
		n, err := c.consumeWindow(ch, name, want, *timeout, *requeue, *reject)
		got += n
		if err != nil {
			return err
		}
		if n < want {
			why := ""
			if n > 0 {
				why = fmt.Sprintf("; if the queue still has messages, the broker's max_prefetch may be below %d: set --window to it", want)
			}
			return fmt.Errorf("got %d of %d messages: none came for %v (--timeout)%s", got, *count, *timeout, why)
		}
	}
	return nil
}

// consumeWindow subscribes with prefetch want, takes up to want deliveries
// (fewer when none comes for timeout), cancels the consumer, then settles
// what it took. It returns how many it took.
func (c *cli) consumeWindow(ch *client.Channel, queue string, want int, timeout time.Duration, requeue, reject bool) (int, error) {
	// The subscribe's answer is waited for --timeout too (a broker that
	// never answers it fails the command then, not 10 s later).
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	defer cancel()
	cs, err := ch.Consume(ctx, queue, client.ConsumeOptions{Prefetch: uint32(want)})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && c.ctx.Err() == nil {
			return 0, fmt.Errorf("consume: the broker did not answer the subscribe to queue %q within %v (--timeout)", queue, timeout)
		}
		return 0, consumeErr(queue, err)
	}
	var got []*client.Delivery
	take := func(d *client.Delivery) {
		got = append(got, d)
		if c.jsonOut {
			p, _ := d.Props()
			b, _ := json.Marshal(map[string]any{"exchange": d.Exchange, "routing_key": d.RoutingKey, "redelivered": d.Redelivered,
				"delivery_count": d.DeliveryCount, "properties": p, "body": string(d.Body)})
			fmt.Fprintf(c.out, "%s\n", b)
		} else {
			fmt.Fprintf(c.out, "%s\n", d.Body)
		}
	}
	idle := time.NewTimer(timeout)
	defer idle.Stop()
	var stopped error
	gone := false // the broker cancelled the consumer (its feed is closed)
wait:
	for len(got) < want {
		select {
		case d, ok := <-cs.Deliveries():
			if !ok {
				gone, stopped = true, fmt.Errorf("consumer stopped: %v", cs.Err())
				break wait
			}
			take(d)
			idle.Reset(timeout)
		case <-idle.C:
			break wait
		case <-c.ctx.Done():
			stopped = c.ctx.Err()
			break wait
		}
	}
	if !gone {
		// Also on an interrupt: Cancel closes the feed whatever the reply.
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := cs.Cancel(cctx)
		ccancel()
		if err != nil && stopped == nil {
			stopped = fmt.Errorf("cancel consumer: %s", protoErr(err))
		}
	}
	// Deliveries the broker sent before it took the cancel are in the
	// feed (never more than the window): take them too.
	for d := range cs.Deliveries() {
		if len(got) < want {
			take(d)
		}
	}
	c.settle(got, requeue, reject)
	if len(got) > 0 && !gone {
		// SETTLE has no reply, and the broker's queue owner applies it
		// after the connection has read it: without waiting, warrenctl
		// could exit (and a following warrenctl dlq peek find nothing)
		// before the rejects were dead-lettered. A passive declare is
		// answered by the queue's owner after what was submitted to it
		// before (spec/PROTOCOL.md §7.2), so once it is answered the
		// settlements have taken effect.
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := ch.DeclareQueue(sctx, queue, client.QueueOptions{Passive: true})
		scancel()
		if err != nil && stopped == nil {
			stopped = fmt.Errorf("settle: %s", protoErr(err))
		}
	}
	return len(got), stopped
}

// consumeErr says what to do about a failed subscribe.
func consumeErr(queue string, err error) error {
	if wire.CodeOf(err) == wire.NotFound {
		return fmt.Errorf("consume: no queue %q (see warrenctl queue list; declare it with: warrenctl queue declare %s)", queue, queue)
	}
	return fmt.Errorf("consume: %s", protoErr(err))
}

func (c *cli) settle(ds []*client.Delivery, requeue, reject bool) {
	for _, d := range ds {
		switch {
		case requeue:
			_ = d.Nack(true)
		case reject:
			_ = d.Reject()
		default:
			_ = d.Ack()
		}
	}
}
