package amqp_test

import (
	"context"
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio/amqp"
)

// basic.recover requeue=true returns every unacked delivery of the
// channel, redelivered with new tags; requeue=false is refused with 540
// not_implemented, as RabbitMQ does.
func TestBasicRecover(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	if _, err := ch.QueueDeclare("rec", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"a", "b", "c"} {
		if err := ch.PublishWithContext(context.Background(), "", "rec", false, false, amqp091.Publishing{Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := ch.Consume("rec", "c", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]uint64{}
	for i := 0; i < 3; i++ {
		d := recv(t, ds)
		if d.Redelivered {
			t.Fatalf("first delivery of %q marked redelivered", d.Body)
		}
		seen[string(d.Body)] = d.DeliveryTag
	}
	if err := ch.Recover(true); err != nil {
		t.Fatalf("basic.recover requeue=true: %v", err)
	}
	for i := 0; i < 3; i++ {
		d := recv(t, ds)
		if !d.Redelivered || d.DeliveryTag <= 3 {
			t.Fatalf("after recover: %q tag %d redelivered=%v, want a redelivery with a new tag", d.Body, d.DeliveryTag, d.Redelivered)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	// Acked after the recover: nothing is left.
	if n, err := ch.QueuePurge("rec", false); err != nil || n != 0 {
		t.Fatalf("purge after acking the redeliveries: %d, %v", n, err)
	}
	if err := ch.Recover(false); amqpCode(err) != 540 {
		t.Fatalf("basic.recover requeue=false: %v, want 540 not_implemented", err)
	}
	_ = conn
}

// x-queue-type classic and quorum declare a queue (quorum: durable, as
// RabbitMQ requires); stream is refused with 406.
func TestQueueTypeArgument(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	if _, err := ch.QueueDeclare("cq", false, false, false, false, amqp091.Table{"x-queue-type": "classic"}); err != nil {
		t.Fatalf("classic: %v", err)
	}
	if _, err := ch.QueueDeclare("qq", true, false, false, false, amqp091.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatalf("quorum: %v", err)
	}
	// It is durable: a non-durable redeclare is not equivalent.
	if _, err := ch.QueueDeclare("qq", false, false, false, false, nil); amqpCode(err) != 406 {
		t.Fatalf("non-durable redeclare of the quorum queue: %v, want 406", err)
	}
	ch, _ = conn.Channel()
	if _, err := ch.QueueDeclare("qq2", false, false, false, false, amqp091.Table{"x-queue-type": "quorum"}); amqpCode(err) != 406 ||
		!strings.Contains(err.Error(), "non-durable") {
		t.Fatalf("non-durable quorum queue: %v, want 406 naming non-durable", err)
	}
	ch, _ = conn.Channel()
	if _, err := ch.QueueDeclare("sq", true, false, false, false, amqp091.Table{"x-queue-type": "stream"}); amqpCode(err) != 406 ||
		!strings.Contains(err.Error(), "stream") {
		t.Fatalf("stream: %v, want 406 naming stream", err)
	}
}

// A redelivery carries x-delivery-count, the deliveries before it.
func TestDeliveryCountHeader(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	if _, err := ch.QueueDeclare("dc", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(context.Background(), "", "dc", false, false,
		amqp091.Publishing{Headers: amqp091.Table{"k": "v"}, Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume("dc", "c", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for want := int64(0); want < 3; want++ {
		d := recv(t, ds)
		got, ok := d.Headers["x-delivery-count"]
		if want == 0 && ok {
			t.Fatalf("first delivery has x-delivery-count %v", got)
		}
		if want > 0 && got != want {
			t.Fatalf("delivery %d: x-delivery-count %v (%T), want %d", want+1, got, got, want)
		}
		if d.Headers["k"] != "v" {
			t.Fatalf("the message's own header is lost: %v", d.Headers)
		}
		if err := d.Nack(false, true); err != nil {
			t.Fatal(err)
		}
	}
}

// Header values come back with the AMQP type they were published with.
func TestHeaderWidthsRoundTrip(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	if _, err := ch.QueueDeclare("hw", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	h := amqp091.Table{
		"i8": int8(-3), "u8": byte(200), "i16": int16(-300), "i32": int32(70000), "i64": int64(1) << 40,
		"f32": float32(1.5), "f64": 2.25, "dec": amqp091.Decimal{Scale: 2, Value: 12345},
		"t": amqp091.Table{"n": int16(7), "s": "x"}, "a": []interface{}{int32(1), int8(2), "s"},
	}
	if err := ch.PublishWithContext(context.Background(), "", "hw", false, false, amqp091.Publishing{Headers: h, Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume("hw", "c", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := recv(t, ds)
	for k, v := range h {
		if !reflect.DeepEqual(d.Headers[k], v) {
			t.Errorf("header %s: %#v, want %#v", k, d.Headers[k], v)
		}
	}
}

// basic.qos global=true is a prefetch shared by the channel's consumers
// (RabbitMQ 3.x), beside each consumer's own (global=false).
func TestGlobalQos(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, l, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	for _, q := range []string{"g1", "g2"} {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp091.Publishing{Body: []byte(q)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// By hand, to see in wire order what was delivered before a barrier.
	nc := rawConn(t, l.Addr().String())
	method := func(class, id uint16, args ...byte) {
		p := binary.BigEndian.AppendUint16(nil, class)
		p = binary.BigEndian.AppendUint16(p, id)
		writeFrame(t, nc, 1, 1, append(p, args...))
	}
	method(20, 10, 0) // channel.open
	if cm := readMethod(t, nc); cm != [2]uint16{20, 11} {
		t.Fatalf("channel.open: %v", cm)
	}
	method(60, 10, 0, 0, 0, 0, 0, 2, 1) // basic.qos prefetch-count 2 global
	if cm := readMethod(t, nc); cm != [2]uint16{60, 11} {
		t.Fatalf("basic.qos global=true: %v, want qos-ok", cm)
	}
	consume := func(q string) {
		args := []byte{0, 0, byte(len(q))}
		args = append(args, q...)
		args = append(args, 0, 0, 0, 0, 0, 0) // consumer tag "", no flags, empty table
		method(60, 20, args...)
	}
	passive := func(q string) {
		args := []byte{0, 0, byte(len(q))}
		args = append(args, q...)
		args = append(args, 1, 0, 0, 0, 0) // passive
		method(50, 10, args...)
	}
	consume("g1")
	consume("g2")
	passive("g1")
	passive("g2")
	var delivered []uint64
	for oks := 0; oks < 2; {
		cm, p := readMethodPayload(t, nc)
		switch cm {
		case [2]uint16{60, 60}:
			tag := binary.BigEndian.Uint64(p[1+int(p[0]):])
			delivered = append(delivered, tag)
		case [2]uint16{50, 11}:
			oks++
		case [2]uint16{60, 21}:
		default:
			t.Fatalf("unexpected method %v", cm)
		}
	}
	if len(delivered) != 2 {
		t.Fatalf("%d deliveries to two consumers under a global prefetch of 2, want 2", len(delivered))
	}
	// An ack lets exactly one more through.
	ack := binary.BigEndian.AppendUint64(nil, delivered[0])
	method(60, 80, append(ack, 0)...)
	passive("g1")
	passive("g2")
	more := 0
	for oks := 0; oks < 2; {
		cm, _ := readMethodPayload(t, nc)
		switch cm {
		case [2]uint16{60, 60}:
			more++
		case [2]uint16{50, 11}:
			oks++
		default:
			t.Fatalf("unexpected method %v", cm)
		}
	}
	if more != 1 {
		t.Fatalf("%d deliveries after one ack under a global prefetch of 2, want 1", more)
	}
	_ = time.Second
}
