package segment_test

import (
	"fmt"
	"os"

	"github.com/warren-mq/warren/segment"
)

// A queue's raft group appends entries (message bodies), compacts behind
// its applied index keeping the messages not yet acked, and reads a live
// message's body without copying it.
func Example() {
	dir, _ := os.MkdirTemp("", "segment-example")
	defer os.RemoveAll(dir)
	log, err := segment.Open(segment.OSFS{}, dir, segment.Options{})
	if err != nil {
		panic(err)
	}
	defer log.Close()

	const queue = 7 // the group id
	var batch []segment.Entry
	for i := uint64(1); i <= 5; i++ {
		batch = append(batch, segment.Entry{Index: i, Term: 1, Data: fmt.Appendf(nil, "message %d", i)})
	}
	// Durable when Append returns; concurrent appends share one fdatasync.
	if err := log.Append(segment.Batch{Group: queue, Entries: batch, HardState: &segment.HardState{Term: 1, Vote: 1, Commit: 5}}); err != nil {
		panic(err)
	}

	// Everything up to 4 is applied; message 2 is still unacked.
	if err := log.Compact(queue, 4, []uint64{2}); err != nil {
		panic(err)
	}
	fmt.Println("raft log:", log.FirstIndex(queue), "to", log.LastIndex(queue))

	es, release, err := log.EntriesView(queue, 2, 3)
	if err != nil {
		panic(err)
	}
	fmt.Printf("live below it: %s\n", es[0].Data)
	release()
	if _, _, err := log.EntriesView(queue, 3, 4); err != nil {
		fmt.Println("acked and dropped:", err)
	}
	// Output:
	// raft log: 5 to 5
	// live below it: message 2
	// acked and dropped: segment: index not available
}
