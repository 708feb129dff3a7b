package replication

import "testing"

// TestMetaChunks: a round's commands are split into entries of at most
// metaEntryBytes of commands (a command larger alone is an entry of its
// own), in order, none empty, none lost.
func TestMetaChunks(t *testing.T) {
	cmd := func(n int) []byte { return make([]byte, n) }
	for _, c := range []struct {
		sizes []int
		want  []int // commands per entry
	}{
		{nil, nil},
		{[]int{10}, []int{1}},
		{[]int{metaEntryBytes - 4}, []int{1}},
		{[]int{metaEntryBytes - 4, 0}, []int{1, 1}},
		{[]int{metaEntryBytes * 2, 10, 10}, []int{1, 2}},
		{[]int{10, metaEntryBytes * 2, 10}, []int{1, 1, 1}},
		{[]int{1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20}, []int{3, 2}},
	} {
		var cmds [][]byte
		for _, n := range c.sizes {
			cmds = append(cmds, cmd(n))
		}
		runs := metaChunks(cmds)
		var got []int
		i := 0
		for _, r := range runs {
			got = append(got, len(r))
			size := 0
			for _, x := range r {
				if len(x) != len(cmds[i]) {
					t.Fatalf("%v: command %d out of order", c.sizes, i)
				}
				i++
				size += 4 + len(x)
			}
			if size > metaEntryBytes && len(r) > 1 {
				t.Fatalf("%v: an entry of %d commands, %d bytes", c.sizes, len(r), size)
			}
		}
		if i != len(cmds) || len(got) != len(c.want) {
			t.Fatalf("%v: runs %v, want %v", c.sizes, got, c.want)
		}
		for k := range got {
			if got[k] != c.want[k] {
				t.Fatalf("%v: runs %v, want %v", c.sizes, got, c.want)
			}
		}
	}
}
