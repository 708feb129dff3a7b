package wire

import (
	"bytes"
	"testing"
)

func publishFrame(n, size int) []byte { return publishFrameCodec(n, size, CodecNone) }

func publishFrameCodec(n, size int, codec Codec) []byte {
	dst, mark := BeginPublish(nil, 1, 1, []byte("events"))
	body := bytes.Repeat([]byte{'x'}, size)
	props := AppendProperties(nil, &Properties{Present: 1 << PropMessageID, MessageID: []byte("message-0001")})[2:]
	for i := 0; i < n; i++ {
		dst = AppendMessage(dst, &Message{Flags: Persistent, RoutingKey: []byte("order.eu.created"), Properties: props, Body: body})
	}
	dst, _ = mark.EndCompressed(dst, uint32(n), codec, nil)
	return dst
}

// BenchmarkDecodePublish: decode and validate a batch of 100 × 128-byte
// messages, then iterate it as the broker does.
func BenchmarkDecodePublish(b *testing.B) {
	raw := publishFrame(100, 128)
	var d Decompressor
	var batch PublishBatch
	var m Message
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		f, _, err := Split(raw, DefaultMaxFrame)
		if err != nil {
			b.Fatal(err)
		}
		if err := DecodePublish(f, DefaultMaxFrame, &d, &batch); err != nil {
			b.Fatal(err)
		}
		it := batch.Messages()
		for it.Next(&m) {
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/msg")
}

// BenchmarkDecodePublishS2 is the same batch compressed with s2.
func BenchmarkDecodePublishS2(b *testing.B) {
	plain := publishFrame(100, 128)
	raw := publishFrameCodec(100, 128, CodecS2)
	var d Decompressor
	var batch PublishBatch
	b.SetBytes(int64(len(plain)))
	b.ReportAllocs()
	for b.Loop() {
		f, _, err := Split(raw, DefaultMaxFrame)
		if err != nil {
			b.Fatal(err)
		}
		if err := DecodePublish(f, DefaultMaxFrame, &d, &batch); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeSettle: a SETTLE frame of 64 ranges.
func BenchmarkDecodeSettle(b *testing.B) {
	var entries []Settlement
	for i := uint64(0); i < 64; i++ {
		entries = append(entries, Settlement{Op: SettleAck, First: i*10 + 1, Last: i*10 + 10})
	}
	raw := AppendSettle(nil, 1, entries)
	var batch SettleBatch
	var s Settlement
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		f, _, err := Split(raw, DefaultMaxFrame)
		if err != nil {
			b.Fatal(err)
		}
		if err := DecodeSettle(f, &batch); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < batch.Count; i++ {
			batch.At(i, &s)
		}
	}
}

// BenchmarkEncodeDeliver: encode a DELIVER frame of 100 × 128-byte messages
// into a reused buffer.
func BenchmarkEncodeDeliver(b *testing.B) {
	body := bytes.Repeat([]byte{'x'}, 128)
	props := AppendProperties(nil, &Properties{Present: 1 << PropMessageID, MessageID: []byte("message-0001")})[2:]
	d := Delivery{Flags: DeliveredPersistent, DeliveryCount: 1, Exchange: []byte("events"),
		RoutingKey: []byte("order.eu.created"), Properties: props, Body: body}
	tag := []byte("consumer-1")
	buf := make([]byte, 0, 64<<10)
	var n int
	b.ReportAllocs()
	for b.Loop() {
		dst, mark := BeginDeliver(buf[:0], 1, tag)
		for i := 0; i < 100; i++ {
			d.Tag = uint64(i + 1)
			dst = AppendDelivery(dst, &d)
		}
		dst = mark.End(dst, 100)
		n = len(dst)
	}
	b.SetBytes(int64(n))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/msg")
}
