package amqp_test

import (
	"testing"

	"github.com/warren-mq/warren/netio/amqp"
)

// Replies on a channel come in the order of the methods they answer, as
// in RabbitMQ, when a client sends its methods without waiting for each
// reply: basic.consume-ok before the basic.cancel-ok of a cancel sent
// right behind it (consume-ok came from the queue's shard, and the
// cancel's was written at once, often first).
func TestPipelinedRepliesInOrder(t *testing.T) {
	_, l, _ := start(t, amqp.Config{})
	nc := rawConn(t, l.Addr().String())
	if _, err := nc.Write(mframe(1, 20, 10, sstr(""))); err != nil {
		t.Fatal(err)
	}
	if cm := readMethod(t, nc); cm != [2]uint16{20, 11} {
		t.Fatalf("want channel.open-ok, got %v", cm)
	}
	var b []byte
	b = append(b, mframe(1, 50, 10, u16b(0), sstr("po"), []byte{0}, ftable(nil))...)
	for range 50 {
		b = append(b, mframe(1, 60, 20, u16b(0), sstr("po"), sstr("c"), []byte{0}, ftable(nil))...)
		b = append(b, mframe(1, 60, 30, sstr("c"), []byte{0})...)
	}
	b = append(b, mframe(1, 50, 40, u16b(0), sstr("po"), []byte{0})...)
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	if cm := readMethod(t, nc); cm != [2]uint16{50, 11} {
		t.Fatalf("want queue.declare-ok, got %v", cm)
	}
	for i := range 50 {
		for _, want := range [][2]uint16{{60, 21}, {60, 31}} {
			if cm := readMethod(t, nc); cm != want {
				t.Fatalf("round %d: got %v, want %v", i, cm, want)
			}
		}
	}
	if cm := readMethod(t, nc); cm != [2]uint16{50, 41} {
		t.Fatalf("want queue.delete-ok, got %v", cm)
	}
}

// The same for queue.purge and a passive queue.declare, answered by the
// queue's shard: a basic.qos pipelined behind one got its qos-ok first.
func TestPipelinedShardAnswersInOrder(t *testing.T) {
	_, l, _ := start(t, amqp.Config{})
	nc := rawConn(t, l.Addr().String())
	if _, err := nc.Write(mframe(1, 20, 10, sstr(""))); err != nil {
		t.Fatal(err)
	}
	if cm := readMethod(t, nc); cm != [2]uint16{20, 11} {
		t.Fatalf("want channel.open-ok, got %v", cm)
	}
	if _, err := nc.Write(mframe(1, 50, 10, u16b(0), sstr("pq"), []byte{0}, ftable(nil))); err != nil {
		t.Fatal(err)
	}
	if cm := readMethod(t, nc); cm != [2]uint16{50, 11} {
		t.Fatalf("want queue.declare-ok, got %v", cm)
	}
	qos := mframe(1, 60, 10, []byte{0, 0, 0, 0}, u16b(10), []byte{0}) // prefetch-size 0, count 10
	var b []byte
	for range 50 {
		b = append(b, mframe(1, 50, 30, u16b(0), sstr("pq"), []byte{0})...)              // purge
		b = append(b, qos...)                                                            // qos
		b = append(b, mframe(1, 50, 10, u16b(0), sstr("pq"), []byte{1}, ftable(nil))...) // passive declare
		b = append(b, qos...)
	}
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		for _, want := range [][2]uint16{{50, 31}, {60, 11}, {50, 11}, {60, 11}} {
			if cm := readMethod(t, nc); cm != want {
				t.Fatalf("round %d: got %v, want %v", i, cm, want)
			}
		}
	}
}
