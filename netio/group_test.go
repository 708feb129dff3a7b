package netio

import (
	"math/rand/v2"
	"testing"

	"github.com/warren-mq/warren/broker"
)

// groupByQueue against the simple model: each queue's items in publish
// order, the queues in the order they first appear, nothing lost or added.
func TestGroupByQueue(t *testing.T) {
	qs := make([]*broker.Queue, 40)
	for i := range qs {
		qs[i] = new(broker.Queue)
	}
	var g grouper
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 2000; trial++ {
		nq := 1 + r.IntN(len(qs)) // past groupLinearMax too: the map index
		n := r.IntN(300)
		items := make([]broker.EnqItem, n)
		for i := range items {
			q := qs[r.IntN(nq)]
			if i > 0 && r.IntN(4) == 0 {
				q = items[i-1].Q // runs, as one producer's batches have
			}
			items[i] = broker.EnqItem{Q: q, Idx: i}
		}
		in := append([]broker.EnqItem(nil), items...)
		got := groupByQueue(items, &g)
		var order []*broker.Queue
		byQ := map[*broker.Queue][]int{}
		for _, it := range in {
			if _, ok := byQ[it.Q]; !ok {
				order = append(order, it.Q)
			}
			byQ[it.Q] = append(byQ[it.Q], it.Idx)
		}
		var want []int
		for _, q := range order {
			want = append(want, byQ[q]...)
		}
		if len(got) != len(want) {
			t.Fatalf("trial %d: %d items, want %d", trial, len(got), len(want))
		}
		for i := range got {
			if got[i].Idx != want[i] || got[i].Q != in[want[i]].Q {
				t.Fatalf("trial %d: item %d is %d, want %d", trial, i, got[i].Idx, want[i])
			}
		}
		for i := range in {
			if items[i] != in[i] {
				t.Fatalf("trial %d: the input was changed at %d", trial, i)
			}
		}
	}
}

// Items already grouped come back as they are, with no copy.
func TestGroupByQueueGroupedIsNotCopied(t *testing.T) {
	a, b := new(broker.Queue), new(broker.Queue)
	items := []broker.EnqItem{{Q: b, Idx: 0}, {Q: b, Idx: 1}, {Q: a, Idx: 2}}
	var g grouper
	if got := groupByQueue(items, &g); &got[0] != &items[0] {
		t.Fatal("grouped items were copied")
	}
	if testing.AllocsPerRun(100, func() { groupByQueue(items, &g) }) != 0 {
		t.Fatal("grouped items allocate")
	}
}

// 16 queues interleaved, as the million scenario's producers publish them.
func BenchmarkGroupByQueue(b *testing.B) {
	qs := make([]*broker.Queue, 16)
	for i := range qs {
		qs[i] = new(broker.Queue)
	}
	items := make([]broker.EnqItem, 2000)
	for i := range items {
		items[i] = broker.EnqItem{Q: qs[i%len(qs)], Idx: i}
	}
	var g grouper
	b.ReportAllocs()
	for b.Loop() {
		groupByQueue(items, &g)
	}
}
